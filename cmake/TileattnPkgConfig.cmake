# tileattn.pc, installed beside the CMake package, for builds that use pkg-config instead of
# find_package(tileattn). A static libtileattn (the default) needs its dependencies on every link
# line, a shared one only in `pkg-config --static` links.
set(_tileattn_pc_libs "-pthread")
if(TILEATTN_WITH_CUDA)
  # The CUDA backend links the static CUDA runtime, which needs these system libraries.
  find_package(CUDAToolkit REQUIRED)
  set(_tileattn_pc_libs "-L${CUDAToolkit_LIBRARY_DIR} -lcudart_static -ldl -lrt ${_tileattn_pc_libs}")
endif()
get_target_property(_tileattn_type tileattn TYPE)
if(_tileattn_type STREQUAL "STATIC_LIBRARY")
  set(TILEATTN_PC_LINK "Requires: libhwy\nLibs: -L\${libdir} -ltileattn ${_tileattn_pc_libs}")
else()
  set(TILEATTN_PC_LINK "Requires.private: libhwy\nLibs: -L\${libdir} -ltileattn\nLibs.private: ${_tileattn_pc_libs}")
endif()
# Relative to the .pc file, so an installed tree can move (cmake --install --prefix, wheels).
file(RELATIVE_PATH _tileattn_pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
set(TILEATTN_PC_PREFIX "\${pcfiledir}/${_tileattn_pc_up}")
string(REGEX REPLACE "/$" "" TILEATTN_PC_PREFIX "${TILEATTN_PC_PREFIX}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/tileattn.pc.in ${PROJECT_BINARY_DIR}/tileattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tileattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
