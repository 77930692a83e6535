// The planner's figures as text for people: one column per strategy, one row per memory category (bytes
// per rank, then per node) and per collective (elements and bytes per step), then a line per strategy on
// what it includes. Used by `gpt-train plan`; the trainer can log the same table.
#pragma once

#include <string>
#include <vector>

#include "plan/planner.h"

namespace gpt {

// REQUIRES: plans == plan_all(in)
std::string plan_report(const PlanInput& in, const std::vector<StrategyPlan>& plans);

// "0", "950", "12.3K", "124.44M", "1.50B".
std::string format_count(int64_t n);

}  // namespace gpt
