// A generation prefers the replica an earlier prompt that began as it does went to
// (supervisor/core/prefix_homes.h): a chat's next turn finds its history in that replica's prefix
// cache instead of computing it again elsewhere. The keys a prompt is known by, the homes the core
// keeps (bounded, forgotten with their replica), the policy's slack, and the core's placement.
#include "supervisor/core/prefix_homes.h"
#include "supervisor/policy/placement.h"
#include "tests/unit/core_generations.h"

namespace warmpool::supervisor::testing {
namespace {

v1::GenerateRequest ChatOf(const std::vector<std::string>& contents, const std::vector<std::string>& tools = {}) {
  v1::GenerateRequest request;
  request.set_model("lm");
  for (size_t i = 0; i < contents.size(); ++i) {
    v1::ChatMessage* m = request.add_messages();
    m->set_role(i == 0 ? "system" : i % 2 == 1 ? "user" : "assistant");
    m->set_content(contents[i]);
  }
  for (const std::string& tool : tools) request.add_tools(tool);
  return request;
}

TEST(PrefixKeysTest, AChatsNextTurnBeginsWithItsEarlierTurnsKeys) {
  const std::vector<uint64_t> first = PrefixKeys(ChatOf({"be brief", "hello"}));
  const std::vector<uint64_t> second = PrefixKeys(ChatOf({"be brief", "hello", "hi there", "how are you"}));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 4u);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), second.begin()));
  // Another system prompt, other tools, or the same bytes split otherwise: other keys throughout.
  for (const v1::GenerateRequest& other :
       {ChatOf({"be long", "hello"}), ChatOf({"be brief", "hello"}, {R"({"type": "function"})"}),
        ChatOf({"be brie", "fhello"})}) {
    const std::vector<uint64_t> keys = PrefixKeys(other);
    for (uint64_t key : keys) EXPECT_EQ(std::count(first.begin(), first.end(), key), 0) << other.DebugString();
  }
  // The roles count too.
  v1::GenerateRequest as_user = ChatOf({"be brief", "hello"});
  as_user.mutable_messages(0)->set_role("user");
  EXPECT_NE(PrefixKeys(as_user)[0], first[0]);
}

TEST(PrefixKeysTest, TextEveryKibibyteAndTokensEveryBlock) {
  v1::GenerateRequest text;
  text.set_prompt(std::string(3 * kPrefixKeyBytes - 1, 'a'));
  EXPECT_EQ(PrefixKeys(text).size(), 2u) << "two whole KiB";
  v1::GenerateRequest longer = text;
  longer.mutable_prompt()->append("bcd");
  const std::vector<uint64_t> a = PrefixKeys(text), b = PrefixKeys(longer);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "the same first two KiB";
  v1::GenerateRequest tokens;
  for (int i = 0; i < 130; ++i) tokens.add_tokens(i);
  EXPECT_EQ(PrefixKeys(tokens).size(), 2u) << "two whole blocks of 64";
  v1::GenerateRequest huge;
  huge.set_prompt(std::string(kPrefixKeyBytes * (kMostPrefixKeys + 5), 'x'));
  EXPECT_EQ(PrefixKeys(huge).size(), kMostPrefixKeys);
  EXPECT_TRUE(PrefixKeys(v1::GenerateRequest()).empty());
  // A chat is hashed up to kMostPrefixBytes: the messages after a huge one have no keys.
  EXPECT_EQ(PrefixKeys(ChatOf({std::string(kMostPrefixBytes + 1, 's'), "hello", "hi"})).size(), 1u);
}

TEST(PrefixHomesTest, TheLongestKnownPrefixWinsAndHomesGoWithTheirReplicaAndAge) {
  PrefixHomes homes;
  const std::vector<uint64_t> keys = {1, 2, 3, 4};
  EXPECT_EQ(homes.Find(0, keys), PrefixHomes::kNoHome);
  homes.Remember(0, std::span(keys).first(2), 7);
  homes.Remember(0, std::span(keys).subspan(2, 1), 8);
  EXPECT_EQ(homes.Find(0, keys), 8u) << "3 is the longest known";
  EXPECT_EQ(homes.Find(0, std::span(keys).first(2)), 7u);
  EXPECT_EQ(homes.Find(1, keys), PrefixHomes::kNoHome) << "another model's";
  homes.Remember(0, std::span(keys).first(1), 8);
  EXPECT_EQ(homes.Find(0, std::span(keys).first(1)), 8u) << "the last to go there";
  homes.ForgetUnless([](uint32_t, uint32_t worker) { return worker != 8; });
  EXPECT_EQ(homes.Find(0, keys), 7u) << "2 is left, at 7";
  EXPECT_EQ(homes.Find(0, std::span(keys).first(1)), PrefixHomes::kNoHome);
  // A key that moved from one worker to another is forgotten with the second, not the first.
  homes.Remember(0, std::span(keys).subspan(3, 1), 10);
  homes.Remember(0, std::span(keys).subspan(3, 1), 11);
  homes.ForgetUnless([](uint32_t, uint32_t worker) { return worker != 10; });
  EXPECT_EQ(homes.Find(0, std::span(keys).subspan(3, 1)), 11u);
  homes.ForgetUnless([](uint32_t, uint32_t worker) { return worker != 11; });
  EXPECT_EQ(homes.Find(0, std::span(keys).subspan(3, 1)), PrefixHomes::kNoHome);
  // Past kMostHomes, the oldest go and the newest stay.
  for (uint64_t k = 100; k < 100 + PrefixHomes::kMostHomes + 10; ++k) {
    const uint64_t key[] = {k};
    homes.Remember(0, key, 9);
  }
  EXPECT_LE(homes.size(), PrefixHomes::kMostHomes);
  EXPECT_EQ(homes.Find(0, keys), PrefixHomes::kNoHome) << "the oldest went";
  const uint64_t newest[] = {100 + PrefixHomes::kMostHomes + 9};
  EXPECT_EQ(homes.Find(0, newest), 9u);
}

TEST(PickReplicaPreferringTest, ThePreferredOneWithinTheSlackWithRoomAndAmongTheReplicas) {
  std::vector<policy::WorkerView> workers(3);
  for (uint32_t i = 0; i < 3; ++i) {
    workers[i].slot = i;
    workers[i].up = true;
  }
  const policy::Window window{4, 1 << 20};
  workers[0].outstanding = 0;
  workers[1].outstanding = 1;
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, 1), 1u) << "one busier: within the slack";
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, policy::kNone), 0u);
  workers[1].outstanding = 2;
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, 1), 0u) << "two busier: past it";
  workers[1].outstanding = 1;
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0}, window, 1), 0u) << "not a candidate (no sequence free)";
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, 2), 0u) << "not among the replicas";
  workers[1].up = false;
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, 1), 0u) << "down";
  workers[1].up = true;
  workers[0].outstanding = 4;
  workers[1].outstanding = 4;
  EXPECT_EQ(policy::PickReplicaPreferring(workers, {0, 1}, window, 1), policy::kNone) << "no room anywhere";
}

// Two replicas of a model that runs three generations at once.
class CorePrefixPlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lm_.sequences = 3;
    rig_.Start({lm_});
    rig_.Up(0);
    rig_.Up(1);
    rig_.Load(1, "lm", /*replicas=*/2);
    std::vector<v1::WorkerEnvelope> load = rig_.Sent(0);
    ASSERT_EQ(load.size(), 1u);
    rig_.Reply(0, CoreRig::LoadDone(load[0].load().job(), lm_), {100});
    std::vector<v1::WorkerEnvelope> attach = rig_.Sent(1);
    ASSERT_EQ(attach.size(), 1u);
    ASSERT_TRUE(attach[0].has_attach());
    rig_.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm_));
    rig_.Forget();
  }
  struct Sent {
    uint32_t slot = 0;
    uint64_t job = 0;
  };
  // The chat goes to a worker: which, and its job there.
  Sent Send(uint64_t session, const std::vector<std::string>& contents) {
    v1::Envelope e;
    *e.mutable_generate() = ChatOf(contents);
    rig_.Request(session, std::move(e), /*admin=*/false);
    for (uint32_t slot : {0u, 1u}) {
      std::vector<v1::WorkerEnvelope> sent = rig_.Sent(slot);
      if (!sent.empty()) return {slot, sent[0].infer().job()};
    }
    ADD_FAILURE() << "session " << session << "'s generation went nowhere";
    return {};
  }
  void Finish(const Sent& s) { rig_.Reply(s.slot, Done(s.job)); }

  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CorePrefixPlacementTest, AChatsNextTurnGoesWhereItsHistoryWentWithinTheSlack) {
  const Sent first = Send(5, {"be brief", "tell me a story"});
  Finish(first);
  const uint32_t home = first.slot;
  // Another chat lands on the same replica (both idle, the first in order), so the chat's home is
  // the busier one by one: the next turn goes there anyway.
  Sent other = Send(6, {"you are a poet", "a haiku"});
  if (other.slot != home) {  // (placed elsewhere: fill the home instead, and free the other)
    const Sent filler = Send(7, {"you are a bard", "a limerick"});  // (no key in common)
    ASSERT_EQ(filler.slot, home) << "the less busy took it";
    Finish(other);
    other = filler;
  }
  const Sent second = Send(8, {"be brief", "tell me a story", "once upon a time", "go on"});
  EXPECT_EQ(second.slot, home) << "its history's replica, one job busier than the other";
  // Two busier than the other: the next turn goes to the idle one, as any new one would.
  const Sent third = Send(9, {"be brief", "tell me a story", "once upon a time", "go on", "and then", "more"});
  EXPECT_NE(third.slot, home);
  Finish(third);
  Finish(second);
  Finish(other);
}

TEST_F(CorePrefixPlacementTest, AReplicasHomesGoWithItsCacheWhenItsWorkerDies) {
  const Sent first = Send(5, {"be brief", "tell me a story"});
  Finish(first);
  const uint32_t home = first.slot, other = 1 - home;
  rig_.Down(home);  // its cache is gone: a respawned worker starts with an empty pool
  rig_.Advance(200);
  rig_.Up(home);
  for (uint32_t slot : {0u, 1u}) {  // the replica comes back on the respawned worker
    for (const v1::WorkerEnvelope& m : rig_.Sent(slot)) {
      if (m.has_attach()) rig_.Reply(slot, CoreRig::LoadDone(m.attach().job(), lm_));
      if (m.has_load()) rig_.Reply(slot, CoreRig::LoadDone(m.load().job(), lm_), {101});
    }
  }
  rig_.Forget();
  // Make the old home the busier by one, as above: a remembered home would still win.
  Sent busy = Send(6, {"you are a poet", "a haiku"});
  if (busy.slot != home) {
    const Sent filler = Send(7, {"you are a bard", "a limerick"});  // (no key in common)
    ASSERT_EQ(filler.slot, home);
    Finish(busy);
    busy = filler;
  }
  const Sent second = Send(8, {"be brief", "tell me a story", "once upon a time", "go on"});
  EXPECT_EQ(second.slot, other) << "no home: the less busy replica";
  Finish(second);
  Finish(busy);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
