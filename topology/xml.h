// A small element tree for topology files, read with libxml2.
//
// Both formats Loom reads (NCCL's topology schema and hwloc's XML) are parsed
// into XmlNode trees first; each element keeps its attributes in file order and
// the line it came from, so every later error can name file, line and element.
// The writer prints the indented, self-closing style NCCL writes, so a dump is
// readable by NCCL and diffs cleanly. Pure data: no globals, thread safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace loom::topo {

struct XmlNode {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;  // in file order
  std::vector<XmlNode> children;                           // elements only
  std::string text;                                        // character data, trimmed
  int line = 0;                                            // 0 when built in memory

  // The attribute's value, or nullptr when absent.
  const std::string* attr(const std::string& key) const;
  std::string attrOr(const std::string& key, const std::string& deflt) const;
  bool has(const std::string& key) const { return attr(key) != nullptr; }
  // Sets (replacing in place) or appends an attribute.
  void set(const std::string& key, const std::string& value);
  void erase(const std::string& key);
  // First child element with this name, or nullptr.
  const XmlNode* child(const std::string& name) const;
  XmlNode* child(const std::string& name);
  XmlNode& add(const std::string& name);
};

// Structural equality: names, attributes (in order), text and children. Lines are ignored.
bool operator==(const XmlNode& a, const XmlNode& b);
inline bool operator!=(const XmlNode& a, const XmlNode& b) { return !(a == b); }

// Parses a file; errors name the file and the line ("f.xml:12: ...").
Result<XmlNode> parseXmlFile(const std::string& path);
// Parses a string; `source` names it in error messages.
Result<XmlNode> parseXmlString(const std::string& text, const std::string& source);

// Writes the tree as XML, two spaces per level, childless elements self-closed.
std::string writeXml(const XmlNode& root);

// "file.xml:12: <pci busid=...>" style location for error messages.
std::string where(const std::string& source, const XmlNode& node);

}  // namespace loom::topo
