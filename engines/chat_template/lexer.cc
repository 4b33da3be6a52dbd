#include "engines/chat_template/lexer.h"

#include "engines/chat_template/value.h"

#include <cctype>

namespace warmpool::chat {
namespace {

// Appends the UTF-8 bytes of a code point (\u escapes in string literals).
void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : s_(source) {}

  Result<std::vector<Piece>> Run() {
    std::vector<Piece> pieces;
    bool trim_next = false;     // `-%}` before: the next text loses its leading whitespace
    bool newline_next = false;  // trim_blocks: the next text loses one leading newline
    while (pos_ < s_.size()) {
      size_t open = s_.find('{', pos_);
      while (open != std::string::npos && open + 1 < s_.size() && s_[open + 1] != '{' && s_[open + 1] != '%' &&
             s_[open + 1] != '#') {
        open = s_.find('{', open + 1);
      }
      if (open + 1 >= s_.size()) open = std::string::npos;
      std::string text = s_.substr(pos_, open == std::string::npos ? std::string::npos : open - pos_);
      if (trim_next) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k])) k++;
        text.erase(0, k);
      } else if (newline_next && !text.empty() && text[0] == '\n') {
        text.erase(0, 1);
      } else if (newline_next && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
        text.erase(0, 2);
      }
      trim_next = newline_next = false;
      if (open == std::string::npos) {
        if (!text.empty() && text.back() == '\n') text.pop_back();  // keep_trailing_newline off
        if (!text.empty()) pieces.push_back(Piece{Piece::Kind::kText, text, {}, line_});
        break;
      }
      const char kind = s_[open + 1];
      size_t body = open + 2;
      const bool strip_before = body < s_.size() && s_[body] == '-';
      const bool keep_before = body < s_.size() && s_[body] == '+';
      if (strip_before || keep_before) body++;
      if (strip_before) {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      } else if (kind != '{' && !keep_before) {  // lstrip_blocks: spaces before a tag on its line
        size_t k = text.size();
        while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) k--;
        if (k == 0 ? AtLineStart(pos_) : text[k - 1] == '\n') text.erase(k);
      }
      CountLines(pos_, open);
      if (!text.empty()) pieces.push_back(Piece{Piece::Kind::kText, text, {}, line_});
      pos_ = body;
      if (kind == '#') {
        const size_t close = s_.find("#}", pos_);
        if (close == std::string::npos) return Error(Code::kInvalidArgument, "line {}: a comment never ends", line_);
        trim_next = close > pos_ && s_[close - 1] == '-';
        newline_next = !trim_next;
        CountLines(pos_, close + 2);
        pos_ = close + 2;
        continue;
      }
      Piece piece{kind == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement, "", {}, line_};
      const std::string close = kind == '{' ? "}}" : "%}";
      if (Status st = Tokens(close, piece.tokens, trim_next); !st.ok()) return st;
      newline_next = kind == '%' && !trim_next;
      pieces.push_back(std::move(piece));
    }
    return pieces;
  }

 private:
  bool AtLineStart(size_t at) const { return at == 0 || s_[at - 1] == '\n'; }
  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < s_.size(); i++) line_ += s_[i] == '\n';
  }

  // Tokens up to the closing delimiter (`close`, maybe with its `-` or `+`).
  Status Tokens(const std::string& close, std::vector<Token>& out, bool& strip_after) {
    static const char* kOperators[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                       ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
    int depth = 0;  // open brackets: `}}` inside a dict literal does not end the tag
    for (;;) {
      while (pos_ < s_.size() && IsSpace(s_[pos_])) line_ += s_[pos_++] == '\n';
      if (pos_ >= s_.size()) return Error(Code::kInvalidArgument, "line {}: a tag never ends (no {})", line_, close);
      for (const char* mark : {"-", "+", ""}) {
        if (depth > 0) break;
        const std::string end = mark + close;
        if (s_.compare(pos_, end.size(), end) == 0) {
          strip_after = *mark == '-';
          pos_ += end.size();
          out.push_back(Token{Token::Kind::kEnd, "", line_});
          return OkStatus();
        }
      }
      const char c = s_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[end])) || s_[end] == '_')) end++;
        out.push_back(Token{Token::Kind::kName, s_.substr(pos_, end - pos_), line_});
        pos_ = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t end = pos_;
        bool real = false;
        while (end < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[end])) || s_[end] == '_' ||
                                   (s_[end] == '.' && !real && end + 1 < s_.size() &&
                                    std::isdigit(static_cast<unsigned char>(s_[end + 1]))))) {
          real = real || s_[end] == '.';
          end++;
        }
        if (end < s_.size() && (s_[end] == 'e' || s_[end] == 'E')) {  // an exponent: 1e20, 2.5e-3
          size_t k = end + 1;
          if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) k++;
          if (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) {
            while (k < s_.size() && std::isdigit(static_cast<unsigned char>(s_[k]))) k++;
            end = k;
            real = true;
          }
        }
        std::string digits;
        for (size_t i = pos_; i < end; i++) if (s_[i] != '_') digits += s_[i];
        out.push_back(Token{real ? Token::Kind::kFloat : Token::Kind::kInt, digits, line_});
        pos_ = end;
      } else if (c == '\'' || c == '"') {
        Result<std::string> value = StringLiteral(c);
        if (!value.ok()) return value.status();
        out.push_back(Token{Token::Kind::kString, *value, line_});
      } else {
        bool matched = false;
        for (const char* op : kOperators) {
          const std::string o = op;
          if (s_.compare(pos_, o.size(), o) == 0) {
            if (o == "(" || o == "[" || o == "{") depth++;
            if ((o == ")" || o == "]" || o == "}") && depth > 0) depth--;
            out.push_back(Token{Token::Kind::kOperator, o, line_});
            pos_ += o.size();
            matched = true;
            break;
          }
        }
        if (!matched) return Error(Code::kInvalidArgument, "line {}: unexpected character '{}'", line_, c);
      }
    }
  }

  Result<std::string> StringLiteral(char quote) {
    std::string value;
    size_t i = pos_ + 1;
    for (; i < s_.size() && s_[i] != quote; i++) {
      if (s_[i] == '\n') line_++;
      if (s_[i] != '\\' || i + 1 >= s_.size()) {
        value += s_[i];
        continue;
      }
      const char e = s_[++i];
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;
        case 'u':
        case 'x': {
          const size_t digits = e == 'u' ? 4 : 2;
          uint32_t cp = 0;
          for (size_t k = 1; k <= digits; k++) {
            const char h = i + k < s_.size() ? s_[i + k] : '\0';
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              return Error(Code::kInvalidArgument, "line {}: a bad \\{} escape", line_, e);
            }
            cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
          }
          if (cp >= 0xD800 && cp < 0xE000) return Error(Code::kInvalidArgument, "line {}: a surrogate escape", line_);
          AppendUtf8(cp, value);
          i += digits;
          break;
        }
        default: value += '\\', value += e;  // Python keeps unknown escapes as they are
      }
    }
    if (i >= s_.size()) return Error(Code::kInvalidArgument, "line {}: a string never ends", line_);
    pos_ = i + 1;
    return value;
  }

  const std::string& s_;
  size_t pos_ = 0;
  size_t line_ = 1;
};

}  // namespace

Result<std::vector<Piece>> Lex(const std::string& source) { return Lexer(source).Run(); }

}  // namespace warmpool::chat
