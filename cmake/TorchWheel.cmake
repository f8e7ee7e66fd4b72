# Finds LibTorch inside the pinned PyPI torch wheel (CUDA build) and makes it link cleanly here.
#
# Two pieces are missing when LibTorch comes from the wheel rather than from a LibTorch zip:
#  1. The wheel's CUDA libraries (libnccl, libcudart, cuDNN, ...) live in the separate nvidia-*
#     wheels under site-packages/nvidia/*/lib. libtorch_cuda.so finds them at run time through its
#     own $ORIGIN RPATH, but GNU ld resolves them at link time through the -rpath list CMake builds,
#     which points at the system toolkit (/usr/local/cuda) and its older NCCL: the link then fails
#     with undefined ncclComm* symbols. We pass the wheel's folders to the linker with -rpath-link.
#  2. Caffe2's cuda.cmake auto-detects architectures that CUDA 13 no longer supports (sm_50). We
#     default TORCH_CUDA_ARCH_LIST to the Hopper and Ampere parts we target.
# DP_TORCH_PREFIX (or CMAKE_PREFIX_PATH) points at torch.utils.cmake_prefix_path.

if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
set(DP_TORCH_PREFIX "" CACHE PATH "torch.utils.cmake_prefix_path of the torch wheel to build against")
if(DP_TORCH_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH "${DP_TORCH_PREFIX}")
endif()

find_package(Torch QUIET)
if(NOT TORCH_FOUND)
  message(WARNING "LibTorch not found: building the launcher only. "
                  "Run ./scripts/setup.sh, or pass -DDP_TORCH_PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')")
  return()
endif()

get_filename_component(DP_TORCH_SITE_PACKAGES "${Torch_DIR}/../../../.." ABSOLUTE)
file(GLOB DP_TORCH_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${DP_TORCH_SITE_PACKAGES}/nvidia/*/lib")
list(JOIN DP_TORCH_NVIDIA_LIB_DIRS ":" _dp_nvidia_path)

# The one target every LibTorch-linking target uses: LibTorch's CPU half only. libtorch_cuda is
# linked by the CUDA plugin alone (dp_torch_cuda below, runtime/parallel/cuda_plugin.cpp), which a
# worker loads where NVIDIA's driver is (Note [CUDA loaded on demand] in
# runtime/parallel/cuda_support.cpp): its static registrations and the CUDA libraries it pulls in
# cost every other process 0.3 s.
add_library(dp_torch INTERFACE)
if(TARGET torch_cpu_library)
  target_link_libraries(dp_torch INTERFACE torch_cpu_library c10)
  target_include_directories(dp_torch INTERFACE ${TORCH_INCLUDE_DIRS})
  # The C++ standard LibTorch's config puts on its `torch` target.
  target_compile_features(dp_torch INTERFACE $<TARGET_PROPERTY:torch,INTERFACE_COMPILE_FEATURES>)
  target_compile_options(dp_torch INTERFACE $<TARGET_PROPERTY:torch,INTERFACE_COMPILE_OPTIONS>)
else()
  target_link_libraries(dp_torch INTERFACE ${TORCH_LIBRARIES})
endif()
target_compile_options(dp_torch INTERFACE ${TORCH_CXX_FLAGS})
target_link_options(dp_torch INTERFACE "LINKER:--as-needed")
# The OpenMP runtime LibTorch's CPU kernels run on (the wheel's own libgomp), for our files built
# with -fopenmp that call at::parallel_for: one runtime and one thread pool, never a second.
find_library(DP_TORCH_OPENMP NAMES libgomp.so.1 gomp PATHS "${DP_TORCH_SITE_PACKAGES}/torch/lib" NO_DEFAULT_PATH)
if(NOT DP_TORCH_OPENMP)
  find_package(OpenMP REQUIRED COMPONENTS CXX)
  set(DP_TORCH_OPENMP OpenMP::OpenMP_CXX)
endif()
target_link_libraries(dp_torch INTERFACE ${DP_TORCH_OPENMP})
# The whole of LibTorch, CUDA included, for the plugin.
add_library(dp_torch_cuda INTERFACE)
target_link_libraries(dp_torch_cuda INTERFACE ${TORCH_LIBRARIES})
target_compile_options(dp_torch_cuda INTERFACE ${TORCH_CXX_FLAGS})
if(_dp_nvidia_path)
  target_link_options(dp_torch_cuda INTERFACE "LINKER:-rpath-link,${_dp_nvidia_path}")
endif()

file(READ "${DP_TORCH_SITE_PACKAGES}/torch/version.py" _dp_torch_version_py)
string(REGEX MATCH "__version__ = '([^']+)'" _m "${_dp_torch_version_py}")
set(DP_LIBTORCH_VERSION "${CMAKE_MATCH_1}")
message(STATUS "LibTorch ${DP_LIBTORCH_VERSION} from ${DP_TORCH_SITE_PACKAGES}/torch")
