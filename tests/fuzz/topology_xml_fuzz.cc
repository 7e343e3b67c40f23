// Fuzzes topology files (topology/: libxml2 into XmlNode trees, then NCCL's schema or hwloc's
// XML into a System): loadTopologyString is what LOOM_TOPO_FILE feeds, and the same reader
// takes other hosts' trees when hosts are merged.
//
// Checked besides crashes: a file that loads dumps (dumpTopology) to text that loads again and
// dumps to the same text.
#include <cstdlib>
#include <string>

#include "topology/topology.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("LOOM_DEBUG", "NONE", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto sys = loom::topo::loadTopologyString(std::string(reinterpret_cast<const char*>(data), size),
                                            "fuzz.xml");
  if (!sys.isOk()) return 0;
  const std::string dumped = loom::topo::dumpTopology(sys.value());
  auto again = loom::topo::loadTopologyString(dumped, "fuzz-dump.xml");
  if (!again.isOk()) {
    fprintf(stderr, "a loaded topology's dump does not load: %s\n",
            again.status().message().c_str());
    abort();
  }
  if (loom::topo::dumpTopology(again.value()) != dumped) {
    fprintf(stderr, "a topology's dump changes when loaded and dumped again\n");
    abort();
  }
  return 0;
}
