#include "core/base/cpu_topology.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <sched.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace glmserve {

std::vector<int> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(absl::StripAsciiWhitespace(text), ',')) {
    if (part.empty()) continue;
    const std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = 0, hi = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &lo) || !absl::SimpleAtoi(ends.back(), &hi) ||
        lo < 0 || hi < lo || hi > 65535) {
      return {};
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
#endif
  return cpus;
}

std::vector<std::vector<int>> NumaNodeCpus() {
  const std::vector<int> allowed = AllowedCpus();
  std::vector<std::vector<int>> nodes;
  for (int node = 0; node < 1024; ++node) {
    std::ifstream in(absl::StrCat("/sys/devices/system/node/node", node, "/cpulist"));
    if (!in) break;
    std::stringstream text;
    text << in.rdbuf();
    std::vector<int> cpus;
    for (const int c : ParseCpuList(text.str())) {
      if (std::binary_search(allowed.begin(), allowed.end(), c)) cpus.push_back(c);
    }
    if (!cpus.empty()) nodes.push_back(std::move(cpus));
  }
  return nodes;
}

std::vector<std::vector<int>> RankCpuSets(int ranks, std::string* how) {
  std::vector<std::vector<int>> nodes = NumaNodeCpus();
  if (static_cast<int>(nodes.size()) == ranks && ranks > 1) {
    if (how != nullptr) *how = absl::StrCat("one rank per NUMA node (", ranks, " nodes)");
    return nodes;
  }
  const std::vector<int> cpus = AllowedCpus();
  const int n = static_cast<int>(cpus.size());
  if (ranks < 1 || n < ranks) {
    if (how != nullptr) {
      *how = absl::StrCat(n, " allowed CPUs for ", ranks, " ranks: threads not pinned");
    }
    return {};
  }
  std::vector<std::vector<int>> sets(ranks);
  for (int r = 0; r < ranks; ++r) {
    sets[r].assign(cpus.begin() + n * r / ranks, cpus.begin() + n * (r + 1) / ranks);
  }
  if (how != nullptr) {
    *how = absl::StrCat(n, " allowed CPUs in ", ranks, " runs of ", n / ranks,
                        n % ranks != 0 ? "+" : "", " (", nodes.size(), " NUMA nodes)");
  }
  return sets;
}

}  // namespace glmserve
