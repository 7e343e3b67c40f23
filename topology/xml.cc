#include "topology/xml.h"

#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace loom::topo {

const std::string* XmlNode::attr(const std::string& key) const {
  for (const auto& kv : attrs)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

std::string XmlNode::attrOr(const std::string& key, const std::string& deflt) const {
  const std::string* v = attr(key);
  return v ? *v : deflt;
}

void XmlNode::set(const std::string& key, const std::string& value) {
  for (auto& kv : attrs)
    if (kv.first == key) {
      kv.second = value;
      return;
    }
  attrs.emplace_back(key, value);
}

void XmlNode::erase(const std::string& key) {
  for (size_t i = 0; i < attrs.size(); ++i)
    if (attrs[i].first == key) {
      attrs.erase(attrs.begin() + static_cast<long>(i));
      return;
    }
}

const XmlNode* XmlNode::child(const std::string& n) const {
  for (const XmlNode& c : children)
    if (c.name == n) return &c;
  return nullptr;
}

XmlNode* XmlNode::child(const std::string& n) {
  for (XmlNode& c : children)
    if (c.name == n) return &c;
  return nullptr;
}

XmlNode& XmlNode::add(const std::string& n) {
  children.emplace_back();
  children.back().name = n;
  return children.back();
}

bool operator==(const XmlNode& a, const XmlNode& b) {
  return a.name == b.name && a.attrs == b.attrs && a.text == b.text && a.children == b.children;
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

XmlNode convert(xmlNodePtr n) {
  XmlNode out;
  out.name = reinterpret_cast<const char*>(n->name);
  out.line = static_cast<int>(xmlGetLineNo(n));
  for (xmlAttrPtr a = n->properties; a != nullptr; a = a->next) {
    xmlChar* v = xmlNodeListGetString(n->doc, a->children, 1);
    out.attrs.emplace_back(reinterpret_cast<const char*>(a->name),
                           v ? reinterpret_cast<const char*>(v) : "");
    xmlFree(v);
  }
  std::string text;
  for (xmlNodePtr c = n->children; c != nullptr; c = c->next) {
    if (c->type == XML_ELEMENT_NODE) {
      out.children.push_back(convert(c));
    } else if (c->type == XML_TEXT_NODE || c->type == XML_CDATA_SECTION_NODE) {
      if (c->content) text += reinterpret_cast<const char*>(c->content);
    }
  }
  out.text = trim(text);
  return out;
}

struct CtxtFree {
  void operator()(xmlParserCtxtPtr c) const { xmlFreeParserCtxt(c); }
};
struct DocFree {
  void operator()(xmlDocPtr d) const { xmlFreeDoc(d); }
};

Result<XmlNode> finish(xmlParserCtxtPtr ctxt, xmlDocPtr raw, const std::string& source) {
  std::unique_ptr<xmlDoc, DocFree> doc(raw);
  if (!doc || !ctxt->wellFormed) {
    const xmlError* e = xmlCtxtGetLastError(ctxt);
    std::string msg = e && e->message ? trim(e->message) : "unreadable or empty";
    int line = e ? e->line : 0;
    return LOOM_ERROR(loomInvalidArgument,
                      source + ":" + std::to_string(line) + ": malformed XML: " + msg);
  }
  xmlNodePtr root = xmlDocGetRootElement(doc.get());
  if (root == nullptr) return LOOM_ERROR(loomInvalidArgument, source + ": no root element");
  return convert(root);
}

constexpr int kParseOptions = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING;

}  // namespace

Result<XmlNode> parseXmlFile(const std::string& path) {
  std::unique_ptr<xmlParserCtxt, CtxtFree> ctxt(xmlNewParserCtxt());
  if (!ctxt) return LOOM_ERROR(loomSystemError, path + ": cannot create an XML parser");
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr)
    return LOOM_ERROR(loomInvalidArgument, path + ": cannot open: " + strerror(errno));
  fclose(f);
  xmlDocPtr doc = xmlCtxtReadFile(ctxt.get(), path.c_str(), nullptr, kParseOptions);
  return finish(ctxt.get(), doc, path);
}

Result<XmlNode> parseXmlString(const std::string& text, const std::string& source) {
  std::unique_ptr<xmlParserCtxt, CtxtFree> ctxt(xmlNewParserCtxt());
  if (!ctxt) return LOOM_ERROR(loomSystemError, source + ": cannot create an XML parser");
  xmlDocPtr doc = xmlCtxtReadMemory(ctxt.get(), text.data(), static_cast<int>(text.size()),
                                    source.c_str(), nullptr, kParseOptions);
  return finish(ctxt.get(), doc, source);
}

namespace {

void escape(const std::string& s, std::string& out) {
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
}

void writeNode(const XmlNode& n, int depth, std::string& out) {
  out.append(static_cast<size_t>(depth) * 2, ' ');
  out += '<';
  out += n.name;
  for (const auto& kv : n.attrs) {
    out += ' ';
    out += kv.first;
    out += "=\"";
    escape(kv.second, out);
    out += '"';
  }
  if (n.children.empty() && n.text.empty()) {
    out += "/>\n";
    return;
  }
  out += '>';
  if (!n.text.empty()) escape(n.text, out);
  if (!n.children.empty()) {
    out += '\n';
    for (const XmlNode& c : n.children) writeNode(c, depth + 1, out);
    out.append(static_cast<size_t>(depth) * 2, ' ');
  }
  out += "</" + n.name + ">\n";
}

}  // namespace

std::string writeXml(const XmlNode& root) {
  std::string out;
  writeNode(root, 0, out);
  return out;
}

std::string where(const std::string& source, const XmlNode& node) {
  std::string s = source;
  if (node.line > 0) s += ":" + std::to_string(node.line);
  s += ": <" + node.name;
  for (const char* key : {"busid", "numaid", "dev", "name", "type", "id"}) {
    if (const std::string* v = node.attr(key)) {
      s += std::string(" ") + key + "=\"" + *v + "\"";
      break;
    }
  }
  return s + ">";
}

}  // namespace loom::topo
