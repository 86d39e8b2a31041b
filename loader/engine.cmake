# Streaming engines, slots, tensor-parallel slices (torch-free) and the swap (torch). Included from
# loader/CMakeLists.txt.
metaload_component(loader_engine
  SOURCES engine.cc engine_device.cc engine_cuda.cc slots.cc tp.cc
  DEPS metaload_kernels_convert
  TORCH_FREE)
metaload_component(loader_swap SOURCES swap.cc slots_torch.cc DEPS metaload_loader_engine)
