// Reading a Prometheus /metrics page: a minimal HTTP/1.0 GET and a sum over the samples of
// one metric. Used by `glm-client bench` (to read the engine's own step time in the same
// run) and by the tests; not a general HTTP client.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace glmserve {

// GETs http://host:port/path and returns the body of a 200 response. `host_port` is
// "host:port" or "[v6]:port".
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout = absl::Seconds(10));

// The sum of every sample of `name` in a text exposition (all label sets), e.g.
// SumSamples(page, "glmserve_step_duration_seconds_count"). 0 when absent.
double SumSamples(const std::string& page, const std::string& name);

// The value of one sample, e.g. SampleValue(page, "glmserve_requests_total",
// "{code=\"OK\",rpc=\"Generate\"}"); labels in the order the page prints them. NOT_FOUND when
// absent.
absl::StatusOr<double> SampleValue(const std::string& page, const std::string& name,
                                   const std::string& labels = "");

}  // namespace glmserve
