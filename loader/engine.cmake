# Streaming engines, slots, tensor-parallel slices (torch-free), and the
# torch side: slots as tensors, the swap, the planner and load(). Included from
# loader/CMakeLists.txt.
metaload_component(loader_engine
  SOURCES engine.cc engine_device.cc engine_cuda.cc file_mapping.cc progress.cc slots.cc tp.cc
  DEPS metaload_kernels_convert
  TORCH_FREE)
metaload_component(loader_load SOURCES swap.cc slots_torch.cc plan.cc
  DEPS metaload_loader_engine metaload_loader_format)
