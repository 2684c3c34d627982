// For tests: ranks as threads of this process, joined by a real Gloo group on
// loopback.
#ifndef TALLY_WORKER_DIST_ON_RANKS_H_
#define TALLY_WORKER_DIST_ON_RANKS_H_

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/dist/free_port.h"
#include "worker/dist/group.h"

namespace tally::dist {

// Runs body(group) on `world` ranks, one thread each.
inline void OnRanks(int world, const std::function<void(Group&)>& body) {
  const std::string address = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GroupOptions o;
      o.rank = r;
      o.world_size = world;
      o.store_address = address;
      o.prefix = "test";
      o.timeout_seconds = 30;
      auto g = Group::Create(o);
      ASSERT_TRUE(g.ok()) << g.status();
      body(**g);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_ON_RANKS_H_
