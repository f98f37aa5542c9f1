# Install rules: headers, the library, the `castor` command, a CMake package (castor::castor) and castor.pc.
include(CMakePackageConfigHelpers)

set(CASTOR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/castor)
install(TARGETS castor castor_cli EXPORT castorTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/castor ${CMAKE_CURRENT_BINARY_DIR}/include/castor
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT castorTargets NAMESPACE castor:: DESTINATION ${CASTOR_CMAKE_DIR})

# castorConfig.cmake finds the same dependencies the library was built with, so they arrive transitively.
# The library links Open MPI (castor::dist), libpng and libjpeg (the image folders), so consumers find them too (their
# headers stay out of Castor's).
set(CASTOR_PACKAGE_DEPENDENCIES "find_dependency(dnnl CONFIG)\nfind_dependency(ZLIB)\nfind_dependency(OpenMP)\nfind_dependency(Threads)\nfind_dependency(PNG)\nfind_dependency(JPEG)\nset(MPI_CXX_SKIP_MPICXX ON)\nfind_dependency(MPI COMPONENTS CXX)")
set(CASTOR_PC_LIBS "-ldnnl -lz -lpng16 -ljpeg -fopenmp -pthread")
set(CASTOR_PC_REQUIRES "ompi-c")
configure_package_config_file(cmake/castorConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/castorConfig.cmake
                              INSTALL_DESTINATION ${CASTOR_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/castorConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/castorConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/castorConfigVersion.cmake
        DESTINATION ${CASTOR_CMAKE_DIR})

# castor.pc finds its prefix from its own place (${pcfiledir}), so `cmake --install --prefix P` needs no reconfigure.
string(REGEX REPLACE "[^/]+" ".." CASTOR_PC_UP "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
configure_file(cmake/castor.pc.in ${CMAKE_CURRENT_BINARY_DIR}/castor.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/castor.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
