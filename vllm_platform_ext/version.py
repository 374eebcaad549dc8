"""This package's version (``setup.py`` says the same): on the ground floor, so that what records it
(``detect.installed_versions``) need not import the package's face."""
__version__ = "0.1.0"
