// Which CPUs each CPU rank of a tensor-parallel group runs on (docs/parallel.md).
#pragma once

#include <string>
#include <vector>

namespace glmserve {

// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> AllowedCpus();

// The NUMA nodes' CPU lists as /sys/devices/system/node/node<i>/cpulist gives them (each
// restricted to AllowedCpus); nodes without allowed CPUs are left out. Empty when the kernel
// does not say (no /sys, or a build without NUMA).
std::vector<std::vector<int>> NumaNodeCpus();

// CPUs for `ranks` ranks: the NUMA nodes' when there are exactly `ranks` of them (a rank per
// memory system), else the allowed CPUs cut into `ranks` contiguous runs of near-equal size.
// Empty when there are fewer allowed CPUs than ranks (then nothing is pinned). `how`, when
// given, says which in a line for the startup summary.
std::vector<std::vector<int>> RankCpuSets(int ranks, std::string* how = nullptr);

// "0-3,8,10-11" -> {0, 1, 2, 3, 8, 10, 11}; empty on a malformed list.
std::vector<int> ParseCpuList(const std::string& text);

}  // namespace glmserve
