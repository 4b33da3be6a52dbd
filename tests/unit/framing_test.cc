// Length-prefixed framing: AppendFrame/Frame on the sending side, FrameDecoder on the receiving side
// fed in arbitrary pieces, and the refusal of an oversized frame before its body is buffered.
#include "ipc/framing.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/warmpool.pb.h"

namespace warmpool::ipc {
namespace {

std::span<const char> Span(const std::string& s) { return {s.data(), s.size()}; }

std::string Prefix(uint32_t n) {
  return std::string{static_cast<char>(n & 0xFF), static_cast<char>((n >> 8) & 0xFF),
                     static_cast<char>((n >> 16) & 0xFF), static_cast<char>((n >> 24) & 0xFF)};
}

std::vector<v1::Envelope> SampleEnvelopes() {
  std::vector<v1::Envelope> out(5);
  out[0].set_request_id(1);
  out[0].set_protocol_version(kProtocolVersion);
  out[0].mutable_load()->set_model("llama-7b");
  out[1].set_request_id(2);
  v1::InferRequest* infer = out[1].mutable_infer();
  infer->set_model("mlp");
  infer->set_deadline_ms(250);
  infer->mutable_input()->set_rows(2);
  infer->mutable_input()->set_cols(3);
  infer->mutable_input()->set_data(std::string(24, '\x7f'));
  out[2].set_request_id(0xFFFFFFFFFFFFull);
  out[2].mutable_error()->set_code(v1::RESOURCE_EXHAUSTED);
  out[2].mutable_error()->set_message("no room");
  out[3].set_request_id(4);
  for (int i = 0; i < 3; i++) out[3].mutable_ps_reply()->add_models()->set_name("m" + std::to_string(i));
  out[4].set_request_id(5);
  out[4].mutable_status();  // an empty sub-message still selects the oneof case
  return out;
}

std::vector<v1::Envelope> DecodeAll(FrameDecoder& decoder) {
  std::vector<v1::Envelope> out;
  std::string body;
  while (decoder.Next(body)) {
    v1::Envelope e;
    EXPECT_TRUE(e.ParseFromString(body));
    out.push_back(e);
  }
  return out;
}

void ExpectSameEnvelopes(const std::vector<v1::Envelope>& got, const std::vector<v1::Envelope>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); i++) {
    EXPECT_EQ(got[i].SerializeAsString(), want[i].SerializeAsString()) << "envelope " << i;
    EXPECT_EQ(got[i].request_id(), want[i].request_id());
    EXPECT_EQ(got[i].body_case(), want[i].body_case());
  }
}

TEST(FrameTest, PrefixIsLittleEndianLength) {
  v1::Envelope e;
  e.set_request_id(300);  // field 1 varint: 08 ac 02
  std::string frame = Frame(e);
  ASSERT_EQ(frame.size(), 7u);
  EXPECT_EQ(frame.substr(0, 4), Prefix(3));
  EXPECT_EQ(frame.substr(4), std::string("\x08\xac\x02", 3));

  v1::Envelope big;
  big.mutable_infer()->mutable_input()->set_data(std::string(70000, 'x'));
  std::string big_frame = Frame(big);
  EXPECT_EQ(big_frame.substr(0, 4), Prefix(static_cast<uint32_t>(big.ByteSizeLong())));
  EXPECT_EQ(big_frame.size(), 4 + big.ByteSizeLong());
}

TEST(FrameTest, AppendFrameAppends) {
  std::string out = "xyz";
  v1::Envelope e;
  e.set_request_id(9);
  ASSERT_TRUE(AppendFrame(out, e).ok());
  ASSERT_TRUE(AppendFrame(out, e).ok());
  EXPECT_EQ(out, "xyz" + Frame(e) + Frame(e));
}

TEST(FrameDecoderTest, RoundTripOneAppendPerFrame) {
  std::vector<v1::Envelope> sent = SampleEnvelopes();
  FrameDecoder decoder;
  std::vector<v1::Envelope> got;
  for (const v1::Envelope& e : sent) {
    ASSERT_TRUE(decoder.Append(Span(Frame(e))).ok());
    EXPECT_EQ(decoder.buffered(), Frame(e).size());
    std::vector<v1::Envelope> one = DecodeAll(decoder);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(decoder.buffered(), 0u);
    got.push_back(one[0]);
  }
  ExpectSameEnvelopes(got, sent);
}

TEST(FrameDecoderTest, ByteByByte) {
  std::vector<v1::Envelope> sent = SampleEnvelopes();
  std::string stream;
  for (const v1::Envelope& e : sent) ASSERT_TRUE(AppendFrame(stream, e).ok());
  FrameDecoder decoder;
  std::vector<v1::Envelope> got;
  size_t frame_end = Frame(sent[0]).size();
  for (size_t i = 0; i < stream.size(); i++) {
    ASSERT_TRUE(decoder.Append(std::span<const char>(stream.data() + i, 1)).ok()) << i;
    std::vector<v1::Envelope> now = DecodeAll(decoder);
    if (i + 1 < frame_end) {
      ASSERT_TRUE(now.empty()) << "a frame came out early at byte " << i;
    } else if (i + 1 == frame_end) {
      ASSERT_EQ(now.size(), 1u) << "frame " << got.size() << " not complete at byte " << i;
      if (got.size() + 1 < sent.size()) frame_end += Frame(sent[got.size() + 1]).size();
    }
    got.insert(got.end(), now.begin(), now.end());
  }
  ExpectSameEnvelopes(got, sent);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoderTest, PartialFrameIsHeldUntilComplete) {
  v1::Envelope e = SampleEnvelopes()[1];
  std::string frame = Frame(e);
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Append(Span(frame.substr(0, 2))).ok());  // half a prefix
  std::string body;
  EXPECT_FALSE(decoder.Next(body));
  EXPECT_EQ(decoder.buffered(), 2u);
  ASSERT_TRUE(decoder.Append(Span(frame.substr(2, 10))).ok());
  EXPECT_FALSE(decoder.Next(body));
  EXPECT_EQ(decoder.buffered(), 12u);
  ASSERT_TRUE(decoder.Append(Span(frame.substr(12))).ok());
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_EQ(body, e.SerializeAsString());
  EXPECT_FALSE(decoder.Next(body));
}

TEST(FrameDecoderTest, ManyFramesInOneAppend) {
  std::string stream;
  std::vector<v1::Envelope> sent;
  for (int i = 0; i < 1000; i++) {
    v1::Envelope e;
    e.set_request_id(i);
    e.mutable_infer()->set_model("model-" + std::to_string(i));
    e.mutable_infer()->mutable_input()->set_data(std::string(i % 97, static_cast<char>(i)));
    sent.push_back(e);
    ASSERT_TRUE(AppendFrame(stream, e).ok());
  }
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Append(Span(stream)).ok());
  ExpectSameEnvelopes(DecodeAll(decoder), sent);
  EXPECT_EQ(decoder.buffered(), 0u);

  // The same stream in odd-sized pieces, decoding as it goes (exercises buffer compaction).
  FrameDecoder chunked;
  std::vector<v1::Envelope> got;
  for (size_t at = 0; at < stream.size(); at += 37) {
    size_t n = std::min<size_t>(37, stream.size() - at);
    ASSERT_TRUE(chunked.Append(std::span<const char>(stream.data() + at, n)).ok());
    std::vector<v1::Envelope> now = DecodeAll(chunked);
    got.insert(got.end(), now.begin(), now.end());
  }
  ExpectSameEnvelopes(got, sent);
  EXPECT_EQ(chunked.buffered(), 0u);
}

TEST(FrameDecoderTest, ZeroLengthFrameIsAnEmptyMessage) {
  v1::Envelope empty;
  std::string frame = Frame(empty);
  EXPECT_EQ(frame, Prefix(0));
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Append(Span(frame + frame)).ok());
  std::string body = "junk";
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_EQ(body, "");
  v1::Envelope parsed;
  parsed.set_request_id(5);
  ASSERT_TRUE(parsed.ParseFromString(body));
  EXPECT_EQ(parsed.request_id(), 0u);
  EXPECT_EQ(parsed.body_case(), v1::Envelope::BODY_NOT_SET);
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_FALSE(decoder.Next(body));
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoderTest, FrameOfExactlyTheLimitIsAccepted) {
  FrameDecoder decoder(1024);
  std::string frame = Prefix(1024) + std::string(1024, 'a');
  ASSERT_TRUE(decoder.Append(Span(frame)).ok());
  std::string body;
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_EQ(body.size(), 1024u);
}

TEST(FrameDecoderTest, OversizeFrameIsRefusedOnItsPrefix) {
  FrameDecoder decoder(1024);
  Status s = decoder.Append(Span(Prefix(1025)));  // only the prefix: no body sent at all
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("frame of 1025 bytes exceeds the limit of 1024 bytes"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("max_frame_bytes"), std::string::npos) << s.message();
  EXPECT_EQ(decoder.buffered(), 0u);
  EXPECT_EQ(decoder.error().code(), Code::kResourceExhausted);
  std::string body;
  EXPECT_FALSE(decoder.Next(body));
}

TEST(FrameDecoderTest, OversizePrefixSplitAcrossAppends) {
  FrameDecoder decoder(1024);
  std::string prefix = Prefix(0xFFFFFFFFu);
  ASSERT_TRUE(decoder.Append(Span(prefix.substr(0, 3))).ok());
  EXPECT_EQ(decoder.buffered(), 3u);
  EXPECT_EQ(decoder.Append(Span(prefix.substr(3) + "body")).code(), Code::kResourceExhausted);
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoderTest, OversizeFrameBehindAGoodOne) {
  FrameDecoder decoder(1024);
  v1::Envelope e;
  e.set_request_id(1);
  ASSERT_TRUE(decoder.Append(Span(Frame(e))).ok());
  EXPECT_EQ(decoder.Append(Span(Prefix(4096) + std::string(100, 'z'))).code(),
            Code::kResourceExhausted);
  EXPECT_EQ(decoder.buffered(), 0u);  // the hostile body is not kept
}

TEST(FrameDecoderTest, EveryAppendAfterAnErrorReturnsIt) {
  FrameDecoder decoder(16);
  Status first = decoder.Append(Span(Prefix(17)));
  ASSERT_FALSE(first.ok());
  v1::Envelope e;
  e.set_request_id(1);
  for (int i = 0; i < 3; i++) {
    Status again = decoder.Append(Span(Frame(e)));
    EXPECT_EQ(again.code(), first.code());
    EXPECT_EQ(again.message(), first.message());
    EXPECT_EQ(decoder.buffered(), 0u);
  }
  EXPECT_EQ(decoder.Append(std::span<const char>()).code(), Code::kResourceExhausted);
  std::string body;
  EXPECT_FALSE(decoder.Next(body));
}

TEST(FrameDecoderTest, GarbageBodyIsAFrameButNotAnEnvelope) {
  // A valid length around bytes that are not a protobuf message: framing delivers them, parsing is
  // where they fail (the connection answers INVALID_ARGUMENT, not the decoder).
  std::string garbage("\xff\xff\xff\xff\xff", 5);
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Append(Span(Prefix(5) + garbage)).ok());
  std::string body;
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_EQ(body, garbage);
  v1::Envelope e;
  EXPECT_FALSE(e.ParseFromString(body));
  // A truncated real message fails too.
  std::string real = SampleEnvelopes()[1].SerializeAsString();
  ASSERT_TRUE(decoder.Append(Span(Prefix(10) + real.substr(0, 10))).ok());
  ASSERT_TRUE(decoder.Next(body));
  EXPECT_FALSE(e.ParseFromString(body));
  // And the decoder is still usable afterwards.
  ASSERT_TRUE(decoder.Append(Span(Frame(SampleEnvelopes()[0]))).ok());
  ASSERT_TRUE(decoder.Next(body));
  ASSERT_TRUE(e.ParseFromString(body));
  EXPECT_EQ(e.load().model(), "llama-7b");
}

}  // namespace
}  // namespace warmpool::ipc
