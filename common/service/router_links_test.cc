// --router's addresses (lists, names resolving to several, bad entries) and
// the placement writer's election among the routers that answer.
#include "common/service/router_links.h"

#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(RouterLinksTest, ResolvesAListToDistinctSortedAddresses) {
  absl::StatusOr<std::vector<std::string>> a =
      ResolveRouters("127.0.0.2:7000, 127.0.0.1:7001,127.0.0.2:7000");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (std::vector<std::string>{"127.0.0.1:7001", "127.0.0.2:7000"}));
  // A name is each of its addresses, of one family: localhost is one router.
  absl::StatusOr<std::vector<std::string>> local = ResolveRouters("localhost:7000");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->size(), 1u);
  absl::StatusOr<std::vector<std::string>> v6 = ResolveRouters("[::1]:7000");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, (std::vector<std::string>{"[::1]:7000"}));
}

TEST(RouterLinksTest, RefusesWhatIsNotHostPort) {
  for (const char* bad :
       {"", ",", "router", "router:", ":7000", "router:0", "router:70000", "[::1:7000", "a:1,b"}) {
    EXPECT_EQ(ResolveRouters(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ResolveRouters("no-such-host.invalid:7000").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(RouterLinksTest, TheWriterIsTheLowestAddressThatAnswers) {
  RouterElection e;
  EXPECT_EQ(e.Writer(), "");
  e.Report("10.0.0.2:7000", true);
  EXPECT_TRUE(e.IsWriter("10.0.0.2:7000"));
  e.Report("10.0.0.1:7000", true);
  EXPECT_EQ(e.Writer(), "10.0.0.1:7000");
  EXPECT_FALSE(e.IsWriter("10.0.0.2:7000"));
  e.Report("10.0.0.1:7000", false);  // it stopped answering
  EXPECT_TRUE(e.IsWriter("10.0.0.2:7000"));
  e.Forget("10.0.0.2:7000");
  EXPECT_EQ(e.Writer(), "");
}

}  // namespace
}  // namespace moesh
