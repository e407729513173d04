# Decides whether the CUDA backend is built, from TILEATTN_CUDA:
#   AUTO  when a CUDA compiler is found and a GPU is visible, for the visible GPUs' architectures
#         (a developer's machine: no hours of kernels for a GPU it does not have);
#   ON    for CMAKE_CUDA_ARCHITECTURES (default in src/cuda: 80-real;90a-real), no GPU needed
#         (wheels, cross-builds, CI's compile check); a missing CUDA compiler is an error;
#   OFF   never.
# Sets TILEATTN_WITH_CUDA (ON/OFF) and, for AUTO without an explicit CMAKE_CUDA_ARCHITECTURES, that
# list.
include(CheckLanguage)

# The compute capabilities nvidia-smi reports as CMake architectures ("90a-real" for an sm_90 GPU:
# the Hopper kernels need the arch-specific target), without those under sm_80, which the kernels
# do not support. Empty when no GPU answers or CUDA_VISIBLE_DEVICES hides them all.
function(tileattn_visible_gpu_architectures out)
  set(archs "")
  set(visible "$ENV{CUDA_VISIBLE_DEVICES}")
  if(DEFINED ENV{CUDA_VISIBLE_DEVICES} AND (visible STREQUAL "" OR visible STREQUAL "-1"))
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  find_program(TILEATTN_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(TILEATTN_NVIDIA_SMI)
  if(TILEATTN_NVIDIA_SMI)
    execute_process(COMMAND "${TILEATTN_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE
                    TIMEOUT 60)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        if(cap MATCHES "^([0-9]+)\\.([0-9]+)$" AND CMAKE_MATCH_1 GREATER_EQUAL 8)
          set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
          if(arch STREQUAL "90")
            set(arch "90a")
          endif()
          list(APPEND archs "${arch}-real")
        elseif(cap MATCHES "^[0-9]")
          message(STATUS "tileattn: a GPU of compute capability ${cap} is visible; the CUDA kernels need 8.0 or newer")
        endif()
      endforeach()
      list(REMOVE_DUPLICATES archs)
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

set(TILEATTN_CUDA AUTO CACHE STRING
    "CUDA backend: AUTO (when a CUDA compiler and a GPU are found, for that GPU), ON (for CMAKE_CUDA_ARCHITECTURES), OFF")
set_property(CACHE TILEATTN_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${TILEATTN_CUDA}" _tileattn_cuda_mode)
set(TILEATTN_WITH_CUDA OFF)
if(_tileattn_cuda_mode STREQUAL "AUTO")
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(STATUS "tileattn: CUDA backend off (TILEATTN_CUDA=AUTO: no CUDA compiler found)")
  else()
    tileattn_visible_gpu_architectures(_tileattn_gpu_archs)
    if(NOT _tileattn_gpu_archs)
      message(STATUS "tileattn: CUDA backend off (TILEATTN_CUDA=AUTO: a CUDA compiler but no usable GPU; "
                     "-DTILEATTN_CUDA=ON builds it for CMAKE_CUDA_ARCHITECTURES without one)")
    else()
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES "${_tileattn_gpu_archs}")
      endif()
      set(TILEATTN_WITH_CUDA ON)
    endif()
  endif()
elseif(_tileattn_cuda_mode MATCHES "^(ON|TRUE|YES|Y|1)$")
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "tileattn: TILEATTN_CUDA=ON but no CUDA compiler was found "
                        "(put nvcc on PATH or set CMAKE_CUDA_COMPILER; TILEATTN_CUDA=AUTO or OFF builds without it)")
  endif()
  set(TILEATTN_WITH_CUDA ON)
elseif(NOT _tileattn_cuda_mode MATCHES "^(OFF|FALSE|NO|N|0)$")
  message(FATAL_ERROR "tileattn: TILEATTN_CUDA must be AUTO, ON or OFF, not '${TILEATTN_CUDA}'")
else()
  message(STATUS "tileattn: CUDA backend off (TILEATTN_CUDA=OFF)")
endif()
