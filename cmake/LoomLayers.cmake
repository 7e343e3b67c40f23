# Layering: each target sees only its own headers and those of the targets it links.
#
# No target has the source tree (the repository root, src/) as an include directory. Instead
# each target's headers are staged in the build tree, in a folder of its own that holds
# symbolic links to them under the path they are included by:
#
#   <build>/layers/loom_util/util/status.h              -> src/util/status.h
#   <build>/layers/loom_algorithms/algorithms/schedule.h -> algorithms/schedule.h
#
# and that folder is the target's include directory (PUBLIC: the targets that link it see it
# too, through target_link_libraries, and nothing else does). So `#include
# "transport/transport.h"` in algorithms/ fails to compile: loom_algorithms links no target
# that stages it. A header belongs to exactly one target; staging one twice fails at
# configure. Headers are found by glob (CONFIGURE_DEPENDS), so a new header in a layer's folder
# is staged at the next build without editing this file; sub-folders are not taken unless
# named, so algorithms/ does not hand algorithms/kernels/ to loom_algorithms.
#
# Include project headers by their full path from the layer ("util/log.h"), never by a path
# relative to the including file ("../transport/transport.h"): the compiler looks beside the
# including file first, and that lookup is the one this cannot close.

# loom_layer(<target> <PUBLIC|PRIVATE|INTERFACE> [DIRS <folder>...] [FILES <header>...]
#            [EXCLUDE <header>...] [BASE <folder>])
#   DIRS     source folders (relative to the source root) whose own headers (*.h, *.inc, *.cuh;
#            not those of sub-folders) the target stages
#   FILES    single headers (relative to the source root) the target stages
#   EXCLUDE  headers of DIRS that belong to another target
#   BASE     the folder the include paths start from (bench: bench/perf/perf.h as "perf/perf.h");
#            by default the source root, and src/ for a folder under it ("util/log.h")
function(loom_layer target scope)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "BASE" "DIRS;FILES;EXCLUDE")
  set(root ${CMAKE_BINARY_DIR}/layers/${target})
  file(REMOVE_RECURSE ${root})  # nothing left over from a header moved or excluded since
  file(MAKE_DIRECTORY ${root})
  set(headers ${arg_FILES})
  foreach(folder ${arg_DIRS})
    if(NOT IS_DIRECTORY ${CMAKE_SOURCE_DIR}/${folder})
      message(FATAL_ERROR "loom_layer(${target}): no folder ${folder}")
    endif()
    file(GLOB found CONFIGURE_DEPENDS RELATIVE ${CMAKE_SOURCE_DIR}
      ${CMAKE_SOURCE_DIR}/${folder}/*.h ${CMAKE_SOURCE_DIR}/${folder}/*.inc
      ${CMAKE_SOURCE_DIR}/${folder}/*.cuh)
    list(APPEND headers ${found})
  endforeach()
  foreach(header ${arg_EXCLUDE})
    if(NOT header IN_LIST headers)
      message(FATAL_ERROR "loom_layer(${target}): EXCLUDE ${header} is not among its headers")
    endif()
    list(REMOVE_ITEM headers ${header})
  endforeach()
  foreach(header ${headers})
    if(NOT EXISTS ${CMAKE_SOURCE_DIR}/${header})
      message(FATAL_ERROR "loom_layer(${target}): ${header} does not exist")
    endif()
    get_property(owner GLOBAL PROPERTY LOOM_LAYER_OWNER_${header})
    if(owner)
      message(FATAL_ERROR "loom_layer(${target}): ${header} is already staged by ${owner}; "
                          "a header belongs to one target (link that target instead)")
    endif()
    set_property(GLOBAL PROPERTY LOOM_LAYER_OWNER_${header} ${target})
    if(arg_BASE)
      file(RELATIVE_PATH included ${CMAKE_SOURCE_DIR}/${arg_BASE} ${CMAKE_SOURCE_DIR}/${header})
    else()
      string(REGEX REPLACE "^src/" "" included ${header})
    endif()
    get_filename_component(dir ${root}/${included} DIRECTORY)
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${header} ${root}/${included} SYMBOLIC)
  endforeach()
  target_include_directories(${target} ${scope} ${root})
endfunction()
