// Stop strings over streamed text: generation ends before the first occurrence of any of them, and
// none of a stop string's text is ever sent. Text that might be the start of one waits until the
// next piece says whether it is; a piece never splits a UTF-8 character (a valid stop string begins
// with a character's first byte, so a match, and what is held back, starts on a boundary).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace warmpool::transformer {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);

  // Takes the next piece of generated text; returns what may be sent now. After a stop string is
  // found, stopped() is true, the text before it has been returned, and nothing more is.
  std::string Push(std::string_view piece);
  // The end of the generation: whatever was held back, unless a stop string was found.
  std::string Finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // not sent yet: it may begin a stop string
  bool stopped_ = false;
};

}  // namespace warmpool::transformer
