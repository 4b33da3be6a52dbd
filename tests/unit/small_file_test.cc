// ReadSmallFile: a user's small file whole, or a typed error; never a read of an unbounded size.
#include "common/small_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "tests/text.h"
#include "tests/unit/temp_dir.h"

namespace warmpool {
namespace {

using testing::Contains;
using testing::TempDir;

TEST(SmallFileTest, ReadsAFileWholeAndRefusesWhatIsNotASmallRegularFile) {
  TempDir dir;
  std::ofstream(dir.File("config.json"), std::ios::binary) << std::string("{\"a\":\0 1}", 9);
  Result<std::string> text = ReadSmallFile(dir.File("config.json"), 100);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, std::string("{\"a\":\0 1}", 9));

  Status large = ReadSmallFile(dir.File("config.json"), 8).status();
  EXPECT_EQ(large.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(large.message(), "9 bytes, more than the 8")) << large.message();

  Status missing = ReadSmallFile(dir.File("missing.json"), 100).status();
  EXPECT_EQ(missing.code(), Code::kNotFound);
  EXPECT_TRUE(Contains(missing.message(), "missing.json")) << missing.message();

  // A FIFO would block a plain open and read: refused at once.
  ASSERT_EQ(mkfifo(dir.File("fifo").c_str(), 0600), 0);
  Status fifo = ReadSmallFile(dir.File("fifo"), 100).status();
  EXPECT_EQ(fifo.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(fifo.message(), "not a regular file")) << fifo.message();
  EXPECT_EQ(ReadSmallFile(dir.path(), 100).status().code(), Code::kInvalidArgument) << "a directory";
  std::ofstream(dir.File("empty")).close();
  Result<std::string> empty = ReadSmallFile(dir.File("empty"), 0);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
}

}  // namespace
}  // namespace warmpool
