"""The TurboQuant wing of the patch groups: K+1 verify batches of vLLM's TurboQuant backend routed to
the plugin's op (:mod:`.spec_verify`, with the cache view each line hands it, :mod:`.cache_view`, and
the synthetic-row baseline route, :mod:`.upstream_rows`), the workspace reserved before vLLM locks it
(:mod:`.reserve_workspace`, 0.22/0.23) and the V1 runner's cache dtype (:mod:`.cache_dtype`,
0.25/0.26)."""
