// The HTML report: the tables are written here as static HTML (readable with
// scripts off); the heatmap's cells are drawn by the page's script from the
// embedded data, so a page of many thousand operations stays small.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "html_template.h"
#include "report.h"

namespace loom::tracetool {
namespace {

using nlohmann::json;

// "", "-2", "-3", ...: the suffix of the i-th communicator's element ids.
std::string idSuffix(size_t i) { return i == 0 ? "" : "-" + std::to_string(i + 1); }

char stateCode(CellState s) {
  switch (s) {
    case CellState::Timed:
      return 't';
    case CellState::Untimed:
      return 'u';
    case CellState::Missing:
      return 'm';
    case CellState::Evicted:
      return 'e';
    case CellState::NoDump:
      return 'n';
  }
  return 'u';
}

json heatmapData(const CommReport& r, size_t i) {
  const Analysis& a = r.analysis;
  const size_t n = static_cast<size_t>(a.nranks);
  json seqs = json::array(), colls = json::array(), lastRanks = json::array();
  std::vector<json> late(n, json::array());
  std::vector<std::string> states(n);
  int64_t maxLate = 0;
  for (const OpTiming& t : a.ops) {
    seqs.push_back(t.seq);
    colls.push_back(t.coll);
    lastRanks.push_back(t.lastRank);
    for (size_t q = 0; q < n; ++q) {
      states[q] += stateCode(t.cells[q]);
      if (t.timed) {
        late[q].push_back(t.lateNs[q]);
        maxLate = std::max(maxLate, t.lateNs[q]);
      } else {
        late[q].push_back(nullptr);
      }
    }
  }
  return {{"heatmapId", "heatmap" + idSuffix(i)},
          {"legendBarId", "legend-bar" + idSuffix(i)},
          {"nranks", a.nranks},
          {"seqs", seqs},
          {"colls", colls},
          {"lastRanks", lastRanks},
          {"late", late},
          {"states", states},
          {"maxLateNs", maxLate}};
}

void stragglerTable(std::ostream& o, const Analysis& a, size_t i) {
  o << "<h3>Stragglers</h3>\n";
  if (a.timedOps == 0) {
    o << "<p>No operation has every rank's entry time.</p>\n";
    return;
  }
  o << "<table id=\"stragglers" << idSuffix(i) << "\" class=\"stragglers\">\n<thead><tr>"
    << "<th>rank</th><th>ops timed</th><th>times last</th><th>mean lateness (us)</th>"
    << "<th>p99 lateness (us)</th><th>max lateness (us)</th><th>wait caused (us)</th>"
    << "</tr></thead>\n<tbody>\n";
  bool first = true;
  for (const RankStats& s : a.stragglersByImpact()) {
    o << "<tr data-rank=\"" << s.rank << "\"" << (first && s.timesLast > 0 ? " class=\"top\"" : "")
      << "><td>" << s.rank << "</td><td>" << s.ops << "</td><td>" << s.timesLast << "</td><td>"
      << usText(s.meanLateNs) << "</td><td>" << usText(static_cast<double>(s.p99LateNs))
      << "</td><td>" << usText(static_cast<double>(s.maxLateNs)) << "</td><td>"
      << usText(s.waitCausedNs) << "</td></tr>\n";
    first = false;
  }
  o << "</tbody></table>\n";
  if (std::string s = slowestLine(a); !s.empty())
    o << "<p class=\"slowest\">" << htmlEscape(s) << "</p>\n";
  if (std::string s = slowestOpsLine(a); !s.empty())
    o << "<p class=\"slowest-ops\">" << htmlEscape(s) << "</p>\n";
}

void dataTable(std::ostream& o, const Analysis& a, size_t i) {
  const std::vector<PeerStats> order = a.sendersByDataDelay();
  if (order.empty()) return;
  o << "<h3>Data per sender</h3>\n<table id=\"senders" << idSuffix(i)
    << "\" class=\"senders\">\n<thead><tr><th>rank</th><th>first arrivals</th>"
    << "<th>mean data delay (us)</th><th>p99 data delay (us)</th><th>max data delay (us)</th>"
    << "<th>longest waits on it</th><th>waited on it (us)</th></tr></thead>\n<tbody>\n";
  for (const PeerStats& p : order)
    o << "<tr data-rank=\"" << p.rank << "\"><td>" << p.rank << "</td><td>" << p.arrivals
      << "</td><td>" << usText(p.meanDataNs) << "</td><td>"
      << usText(static_cast<double>(p.p99DataNs)) << "</td><td>"
      << usText(static_cast<double>(p.maxDataNs)) << "</td><td>" << p.longestWaits << "</td><td>"
      << usText(p.waitedOnNs) << "</td></tr>\n";
  o << "</tbody></table>\n";
  if (std::string s = slowestLinkLine(a); !s.empty())
    o << "<p class=\"slowest-link\">" << htmlEscape(s) << "</p>\n";
}

void skewTable(std::ostream& o, const Analysis& a) {
  if (a.skew.empty()) return;
  o << "<h3>Skew per operation</h3>\n<table class=\"skew\"><thead><tr><th>operation</th>"
    << "<th>ops</th><th>mean skew (us)</th><th>p99 skew (us)</th><th>max skew (us)</th>"
    << "</tr></thead>\n<tbody>\n";
  for (const SkewGroup& g : a.skew)
    o << "<tr><td>" << htmlEscape(g.label()) << "</td><td>" << g.ops << "</td><td>"
      << usText(g.meanNs) << "</td><td>" << usText(static_cast<double>(g.p99Ns)) << "</td><td>"
      << usText(static_cast<double>(g.maxNs)) << "</td></tr>\n";
  o << "</tbody></table>\n";
}

void section(std::ostream& o, const CommReport& r, size_t i) {
  const Analysis& a = r.analysis;
  const ExitCode v = a.verdict();
  int64_t maxLate = 0;
  for (const RankStats& s : a.ranks) maxLate = std::max(maxLate, s.maxLateNs);
  o << "<section class=\"comm\" id=\"comm" << idSuffix(i) << "\">\n<h2>Communicator "
    << htmlEscape(r.comm->label()) << ": " << a.nranks << " ranks, " << a.ops.size()
    << " operations</h2>\n<p class=\"verdict " << (v == kExitConsistent ? "ok" : "bad")
    << "\">Verdict: " << verdictName(v) << " (exit " << static_cast<int>(v) << ")</p>\n"
    << "<h3>Lateness per rank and operation</h3>\n<div class=\"legend\">on time "
    << "<span class=\"bar\" id=\"legend-bar" << idSuffix(i) << "\"></span> "
    << usText(static_cast<double>(maxLate)) << " us late"
    << " <span class=\"swatch missing\"></span> never entered"
    << " <span class=\"swatch untimed\"></span> entered, not timed"
    << " <span class=\"swatch unknown\"></span> not recorded</div>\n"
    << "<div class=\"heatwrap\"><div class=\"heatmap\" id=\"heatmap" << idSuffix(i)
    << "\" data-ranks=\"" << a.nranks << "\" data-ops=\"" << a.ops.size() << "\"></div></div>\n"
    << "<noscript><p>The heatmap is drawn by JavaScript.</p></noscript>\n";
  stragglerTable(o, a, i);
  dataTable(o, a, i);
  skewTable(o, a);
  o << "<h3>Hang analysis</h3>\n<ul class=\"findings\">\n";
  for (const std::string& l : lastSeenLines(a)) o << "<li>" << htmlEscape(l) << "</li>\n";
  for (const std::string& l : findingLines(a, 200)) o << "<li>" << htmlEscape(l) << "</li>\n";
  o << "</ul>\n</section>\n";
}

}  // namespace

std::string htmlEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const char* entity = ch == '&'   ? "&amp;"
                         : ch == '<' ? "&lt;"
                         : ch == '>' ? "&gt;"
                         : ch == '"' ? "&quot;"
                                     : nullptr;
    if (entity != nullptr)
      out += entity;
    else
      out += ch;
  }
  return out;
}

std::string htmlReport(const std::vector<CommReport>& reports) {
  std::ostringstream body;
  json comms = json::array();
  for (size_t i = 0; i < reports.size(); ++i) {
    section(body, reports[i], i);
    comms.push_back(heatmapData(reports[i], i));
  }
  std::string data = json{{"comms", comms}}.dump(-1, ' ', false, json::error_handler_t::replace);
  // '<' only occurs inside JSON strings, where \u003c means the same; so no "</script>".
  std::string safe;
  for (char ch : data) safe += ch == '<' ? std::string("\\u003c") : std::string(1, ch);
  std::string title = "Loom trace report";
  if (reports.size() == 1) title += ": " + reports[0].comm->label();
  const std::map<std::string, std::string> fill = {
      {"@TITLE@", htmlEscape(title)}, {"@BODY@", body.str()}, {"@DATA@", safe}};
  // Substitute the template's own markers only, never text that a substitution brought in.
  const std::string tmpl = kHtmlTemplate;
  std::string out;
  size_t pos = 0;
  while (pos < tmpl.size()) {
    size_t at = tmpl.find('@', pos);
    size_t end = at == std::string::npos ? at : tmpl.find('@', at + 1);
    auto it = end == std::string::npos ? fill.end() : fill.find(tmpl.substr(at, end - at + 1));
    if (it == fill.end()) {
      size_t upto = at == std::string::npos ? tmpl.size() : at + 1;
      out.append(tmpl, pos, upto - pos);
      pos = upto;
      continue;
    }
    out.append(tmpl, pos, at - pos);
    out += it->second;
    pos = end + 1;
  }
  return out;
}

}  // namespace loom::tracetool
