// A minimal JSON writer for the runtime's own documents (the debug snapshot): objects, arrays, strings, numbers.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace hp::shmem {

class JsonWriter {
 public:
  void Key(const char* key) {
    Separator();
    Quoted(key);
    out_ += ':';
    after_key_ = true;
  }
  void String(const std::string& value) {
    Separator();
    Quoted(value);
  }
  void Unsigned(std::uint64_t value) { Raw(std::to_string(value)); }
  void Signed(std::int64_t value) { Raw(std::to_string(value)); }
  void Bool(bool value) { Raw(value ? "true" : "false"); }
  void Double(double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", value);   // round-trips; config values are finite
    std::string number(text);
    // Stays a float for the reader (10.0, as the torch binding gives Python, not 10).
    if (number.find_first_of(".e") == std::string::npos) number += ".0";
    Raw(number);
  }
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  const std::string& text() const { return out_; }

 private:
  // `value` as a JSON string: quotes, backslashes and control characters escaped, other bytes (UTF-8) as they are.
  void Quoted(const std::string& value) {
    out_ += '"';
    for (const char c : value) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        case '\b': out_ += "\\b"; break;
        case '\f': out_ += "\\f"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
            out_ += escaped;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }
  void Raw(const std::string& text) {
    Separator();
    out_ += text;
  }
  void Open(char c) {
    Separator();
    out_ += c;
    first_ = true;
  }
  void Close(char c) {
    out_ += c;
    first_ = false;
  }
  // A comma before every value or key but the first of its container; none between a key and its value.
  void Separator() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) out_ += ',';
    first_ = false;
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

}  // namespace hp::shmem
