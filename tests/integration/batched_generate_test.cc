// Continuous batching through the daemon: a model's generations run together in its worker (each
// gets its first chunk before any ends), each saying what it says alone; [[models]] parallel caps
// how many a replica runs, the rest waiting in the daemon until one ends; metrics count the
// sequences the replicas hold; a KV cache smaller than every sequence's whole context runs those
// it has room for. A prompt that begins as an earlier one did finds that beginning in
// the model's prefix cache, and the reply and the metrics say how much of it.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/http_exchange.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class BatchedGenerateTest : public DaemonTest {
 protected:
  static v1::GenerateRequest Greedy(const std::string& prompt, uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_model("tiny");
    r.set_prompt(prompt);
    r.set_max_tokens(max_tokens);
    r.set_temperature(0);
    r.set_stream(true);
    return r;
  }
  struct Seen {
    std::string text;
    Result<v1::GenerateReply> final = Status();
    int order_of_first_chunk = -1;  // among all events on the connection
    int order_of_final = -1;
  };
  // Sends every request on one connection at once and reads the replies in the order they come.
  static std::vector<Seen> SendTogether(client::Client& c, const std::vector<v1::GenerateRequest>& requests) {
    std::vector<Seen> seen(requests.size());
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < requests.size(); ++i) {
      v1::Envelope e;
      *e.mutable_generate() = requests[i];
      Result<uint64_t> id = c.Send(e);
      EXPECT_TRUE(id.ok());
      if (id.ok()) index[*id] = i;
    }
    int events = 0;
    size_t finals = 0;
    while (finals < requests.size()) {
      Result<v1::Envelope> reply = c.Receive();
      if (!reply.ok()) {
        ADD_FAILURE() << reply.status().ToString();
        break;
      }
      Seen& s = seen[index.at(reply->request_id())];
      if (reply->has_generate_chunk()) {
        s.text += reply->generate_chunk().text();
        if (s.order_of_first_chunk < 0) s.order_of_first_chunk = events;
      } else {
        if (reply->has_generate_reply()) s.final = reply->generate_reply();
        else s.final = Status(CodeFromInt(reply->error().code()), reply->error().message());
        s.order_of_final = events;
        finals++;
      }
      events++;
    }
    return seen;
  }
  // The first stream to send a chunk held up for 200 ms after it (an injected fault; the daemon
  // started with --enable-fault-injection): on a loaded machine the tiny model could otherwise
  // finish it before the requests sent with it reached the worker, and they would never meet.
  static void HoldUpTheFirstStream(client::Client& c) {
    ASSERT_TRUE(c.ArmFault(client::FaultSpec{"infer.mid", "delay:200", "tiny", 0, 1}).ok());
  }
  static const inline std::vector<std::string> kPrompts = {"This License applies to", "Everyone is permitted",
                                                            "You may convey", "the GNU General"};
};

TEST_F(BatchedGenerateTest, GenerationsRunTogetherAndEachSaysWhatItSaysAlone) {
  WriteTinyModel(models_dir_ + "/tiny", transformer::RandomCheckpoint{});  // f32: batched or alone, the same sums
  StartDaemon("", {"--enable-fault-injection"});
  auto c = Connect();
  auto models = c->Models();
  ASSERT_TRUE(models.ok() && models->models_size() == 1);
  EXPECT_EQ(models->models(0).parallel(), 4u) << "the CPU engine's default";
  const uint64_t cache = uint64_t{models->models(0).context()} * models->models(0).kv_bytes_per_token();
  EXPECT_GE(models->models(0).workspace_bytes(), 4 * cache) << "a cache per sequence counted";
  std::vector<std::string> alone;
  for (const std::string& p : kPrompts) {
    auto whole = c->Generate([&] {
      v1::GenerateRequest r = Greedy(p, 40);
      r.set_stream(false);
      return r;
    }());
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    alone.push_back(whole->text());
  }
  HoldUpTheFirstStream(*c);
  std::vector<v1::GenerateRequest> requests;
  for (const std::string& p : kPrompts) requests.push_back(Greedy(p, 40));
  std::vector<Seen> seen = SendTogether(*c, requests);
  int first_final = 1 << 30;
  for (const Seen& s : seen) first_final = std::min(first_final, s.order_of_final);
  for (size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    ASSERT_TRUE(seen[i].final.ok()) << seen[i].final.status().ToString();
    EXPECT_EQ(seen[i].text, alone[i]);
    EXPECT_EQ(seen[i].final->completion_tokens(), 40u);
    EXPECT_LT(seen[i].order_of_first_chunk, first_final) << "it ran beside the others, not after them";
  }
  // Four sequences' blocks in its one replica's pool: one generation holds its own blocks, at most
  // a quarter (its whole context), and gives them back when it ends (the gauge is the engine's
  // count of blocks, published on the daemon's tick).
  auto usage = [&] {
    std::vector<Response> scraped = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
    const std::string name = "warmpool_model_kv_cache_usage_ratio{model=\"tiny\"} ";
    const size_t at = scraped.empty() ? std::string::npos : scraped[0].body.find(name);
    return at == std::string::npos ? -1.0 : std::stod(scraped[0].body.substr(at + name.size()));
  };
  {
    auto running = Connect();
    v1::Envelope e;
    *e.mutable_generate() = Greedy("This License applies to", 0);  // to the end of the context
    auto id = running->Send(e);
    ASSERT_TRUE(id.ok());
    auto chunk = running->Wait(*id);
    ASSERT_TRUE(chunk.ok() && chunk->has_generate_chunk());
    double seen = 0;
    for (int i = 0; i < 100 && seen <= 0; i++) {
      seen = usage();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_GT(seen, 0.0) << "a running generation holds blocks";
    // Counted in blocks, not sequences (which would say a quarter): tokens into its 2048, it holds a
    // few of the pool's 128.
    EXPECT_LT(seen, 0.1) << "one of four sequences, early in its context";
  }  // it leaves: its generation is cancelled, its blocks given back
  double after = 1;
  for (int i = 0; i < 150 && after != 0; i++) {
    after = usage();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after, 0.0) << "no generation runs: no block is held (those kept for the prefix cache are free)";
}

TEST_F(BatchedGenerateTest, ParallelCapsWhatAReplicaRunsAndTheRestWaitInTheDaemon) {
  WriteTinyModel(models_dir_ + "/tiny", transformer::RandomCheckpoint{});
  StartDaemon("[[models]]\nname = \"tiny\"\npath = \"models/tiny\"\nparallel = 2\n", {"--enable-fault-injection"});
  auto c = Connect();
  auto models = c->Models();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->models_size(), 1);
  EXPECT_EQ(models->models(0).parallel(), 2u);

  std::vector<v1::GenerateRequest> requests;
  for (const std::string& p : kPrompts) requests.push_back(Greedy(p, 30));
  HoldUpTheFirstStream(*c);
  std::vector<Seen> seen = SendTogether(*c, requests);
  for (const Seen& s : seen) ASSERT_TRUE(s.final.ok()) << s.final.status().ToString();
  // The first two ran together; the third started only when one of them ended, the fourth when
  // another did.
  EXPECT_LT(seen[1].order_of_first_chunk, std::min(seen[0].order_of_final, seen[1].order_of_final));
  EXPECT_GT(seen[2].order_of_first_chunk, std::min(seen[0].order_of_final, seen[1].order_of_final));
  std::vector<int> finals;
  for (const Seen& s : seen) finals.push_back(s.order_of_final);
  std::sort(finals.begin(), finals.end());
  EXPECT_GT(seen[3].order_of_first_chunk, finals[1]) << "two finals before the fourth's first chunk";
}

// A KV cache of one context ([[models]] kv_cache_tokens) shared by four sequences: three streams
// that each come to need more than half of it start together, each admitted by its prompt (engine
// ABI version 13); as they grow, the youngest are preempted, handed back to the daemon, and resumed
// after the chunks they sent. Each stream is answered in full with the text it has alone, and the
// metrics count the waits.
TEST_F(BatchedGenerateTest, AKvCacheOfOneContextIsSharedByPreemptingTheYoungestStreams) {
  WriteTinyModel(models_dir_ + "/tiny", transformer::RandomCheckpoint{});
  StartDaemon("[[models]]\nname = \"tiny\"\npath = \"models/tiny\"\nkv_cache_tokens = 2048\n",
              {"--enable-fault-injection"});
  auto c = Connect();
  auto models = c->Models();
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->models_size(), 1);
  ASSERT_EQ(models->models(0).context(), 2048u);
  EXPECT_EQ(models->models(0).parallel(), 4u);
  EXPECT_EQ(models->models(0).kv_cache_tokens(), 2048u);

  constexpr uint32_t kTokens = 1100;  // 18 of 32 blocks each
  std::vector<std::string> alone;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest whole = Greedy(kPrompts[i], kTokens);
    whole.set_stream(false);
    auto reply = c->Generate(whole);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_EQ(reply->completion_tokens(), kTokens);
    alone.push_back(reply->text());
    requests.push_back(Greedy(kPrompts[i], kTokens));
  }
  HoldUpTheFirstStream(*c);
  std::vector<Seen> seen = SendTogether(*c, requests);
  int first_final = 1 << 30;
  for (const Seen& s : seen) first_final = std::min(first_final, s.order_of_final);
  for (size_t i = 0; i < seen.size(); ++i) {
    SCOPED_TRACE(kPrompts[i]);
    ASSERT_TRUE(seen[i].final.ok()) << seen[i].final.status().ToString();
    EXPECT_EQ(seen[i].text, alone[i]) << "no chunk twice, none missing, across its preemptions";
    EXPECT_EQ(seen[i].final->completion_tokens(), kTokens);
    EXPECT_LT(seen[i].order_of_first_chunk, first_final) << "it started beside the others";
  }

  std::vector<Response> scraped = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
  ASSERT_EQ(scraped.size(), 1u);
  for (const char* counter : {"waits", "preemptions"}) {
    const std::string name = fmt::format("warmpool_model_kv_cache_{}_total{{model=\"tiny\"}} ", counter);
    const size_t at = scraped[0].body.find(name);
    ASSERT_NE(at, std::string::npos) << scraped[0].body;
    EXPECT_GE(std::stoul(scraped[0].body.substr(at + name.size())), 1u) << "a stream preempted, and waiting";
  }
}

TEST_F(BatchedGenerateTest, ASecondTurnFindsItsHistoryInThePrefixCacheAndSaysSo) {
  WriteTinyModel(models_dir_ + "/tiny", transformer::RandomCheckpoint{});
  StartDaemon();
  auto c = Connect();
  std::string history;
  for (int i = 0; i < 40; ++i) history += kPrompts[i % kPrompts.size()] + " ";
  v1::GenerateRequest first = Greedy(history, 8);
  first.set_stream(false);
  auto one = c->Generate(first);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->cached_prompt_tokens(), 0u) << "a cold cache";
  ASSERT_GT(one->prompt_tokens(), 128u) << "a history of whole blocks";

  v1::GenerateRequest next = Greedy(history + one->text() + " and then", 8);
  next.set_stream(false);
  auto two = c->Generate(next);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  // Whole blocks of 64 tokens, at most the first turn's prompt and answer, never the whole prompt.
  EXPECT_GE(two->cached_prompt_tokens(), 128u);
  EXPECT_EQ(two->cached_prompt_tokens() % 64, 0u);
  EXPECT_LE(two->cached_prompt_tokens(), one->prompt_tokens() + one->completion_tokens());
  EXPECT_LT(two->cached_prompt_tokens(), two->prompt_tokens());

  std::vector<Response> scraped = Split(Exchange(ConnectUnix(socket_), HttpGet("/metrics", true)));
  ASSERT_EQ(scraped.size(), 1u);
  EXPECT_NE(scraped[0].body.find("warmpool_model_prompt_tokens_cached_total{model=\"tiny\"} " +
                                 std::to_string(two->cached_prompt_tokens()) + "\n"),
            std::string::npos)
      << scraped[0].body;
  auto ps = c->Ps();
  ASSERT_TRUE(ps.ok());
  ASSERT_EQ(ps->models_size(), 1);
  EXPECT_EQ(ps->models(0).prompt_tokens(), uint64_t{one->prompt_tokens()} + two->prompt_tokens());
  EXPECT_EQ(ps->models(0).cached_prompt_tokens(), two->cached_prompt_tokens());
  std::string table;
  ASSERT_EQ(Cli({"ps"}, &table), 0);
  EXPECT_NE(table.find("PREFIX HITS"), std::string::npos) << table;
  EXPECT_NE(table.find(fmt::format("{}%", ps->models(0).cached_prompt_tokens() * 100 / ps->models(0).prompt_tokens())),
            std::string::npos)
      << table;
}

}  // namespace
}  // namespace warmpool::testing
