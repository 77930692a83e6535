// The strict JSON reader: what it reads, and the malformed texts it refuses, each with its line and column.
#include "core/json.h"

#include <catch2/catch.hpp>
#include <string>

namespace gpt::json {
namespace {

TEST_CASE("json: values, members in file order, escapes and numbers", "[core]") {
  const auto v = parse(
      "\xEF\xBB\xBF{\"b\": [1, -2.5e-3, 0, -0, true, false, null], \"a\": {\"x\": \"caf\\u00e9 \\ud83d\\ude00\"},\n"
      " \"s\": \"tab\\tquote\\\" slash\\/ back\\\\ \xc3\xa9\", \"e\": {}, \"l\": []}  \n");
  REQUIRE(v.has_value());
  REQUIRE(v->is_object());
  REQUIRE(v->size() == 5);
  CHECK(v->key(0) == "b");
  CHECK(v->key(1) == "a");
  const Value* b = v->find("b");
  REQUIRE(b != nullptr);
  REQUIRE(b->is_array());
  REQUIRE(b->size() == 7);
  CHECK(b->item(0).as_int64() == 1);
  CHECK_FALSE(b->item(1).as_int64().has_value());
  CHECK(*b->item(1).as_double() == Approx(-2.5e-3));
  CHECK(b->item(1).text() == "-2.5e-3");
  CHECK(b->item(2).as_int64() == 0);
  CHECK(b->item(3).as_int64() == 0);
  CHECK(b->item(4).is_bool());
  CHECK(b->item(4).boolean());
  CHECK_FALSE(b->item(5).boolean());
  CHECK(b->item(6).is_null());
  CHECK(v->find("a")->find("x")->text() == "caf\xc3\xa9 \xf0\x9f\x98\x80");
  CHECK(v->find("s")->text() == "tab\tquote\" slash/ back\\ \xc3\xa9");
  CHECK(v->find("e")->is_object());
  CHECK(v->find("e")->size() == 0);
  CHECK(v->find("l")->is_array());
  CHECK(v->find("nope") == nullptr);
  CHECK(b->find("x") == nullptr);  // not an object
  CHECK(parse("9223372036854775807")->as_int64() == INT64_MAX);
  CHECK_FALSE(parse("9223372036854775808")->as_int64().has_value());
  CHECK_FALSE(parse("1e400")->as_double().has_value());
  CHECK_FALSE(parse("\"1\"")->as_int64().has_value());
  CHECK(parse("  \"\"  ")->text().empty());
}

TEST_CASE("json: malformed texts are errors naming the line and column", "[core]") {
  const auto fails = [](const std::string& text, const std::string& where, const std::string& what) {
    const auto v = parse(text);
    INFO(text);
    REQUIRE_FALSE(v.has_value());
    INFO(v.status().message());
    CHECK(v.status().message().find("not valid JSON: " + where + ": ") != std::string::npos);
    CHECK(v.status().message().find(what) != std::string::npos);
  };
  fails("{\"a\": 1,\n \"b\": 2, \"a\": 3}", "line 2, column 10",
        "the key \"a\" again (first at line 1, column 2): an object's keys must differ");
  fails("{\"b\": 1, \"b\": 2, \"a\": 1,\n\"a\": 2}", "line 1, column 10",
        "the key \"b\" again (first at line 1, column 2)");
  fails("[1, {\"k\": 0, \"k\": 0}]", "line 1, column 14", "the key \"k\" again (first at line 1, column 6)");
  fails("{\"id\": 0x10}", "line 1, column 9", "no hexadecimal");
  fails("[01]", "line 1, column 3", "no leading zeros");
  fails("[1.]", "line 1, column 4", "expected a digit after '.'");
  fails("[1e]", "line 1, column 4", "exponent");
  fails("[-]", "line 1, column 3", "expected a digit after '-'");
  fails("[1,]", "line 1, column 4", "expected a value");
  fails("{\"a\": 1,}", "line 1, column 9", "expected a member's key");
  fails("{\"a\" 1}", "line 1, column 6", "expected ':'");
  fails("[1 2]", "line 1, column 4", "expected ',' or ']'");
  fails("{\"a\": 1 \"b\": 2}", "line 1, column 9", "expected ',' or '}'");
  fails("{} x", "line 1, column 4", "text after the JSON value");
  fails("", "line 1, column 1", "found the end of the text");
  fails("\n\n  [yes]", "line 3, column 4", "expected a value");
  fails("['a']", "line 1, column 2", "found '''");
  fails("\"open", "line 1, column 6", "not closed");
  fails("\"a\tb\"", "line 1, column 3", "control character (byte 0x09)");
  fails("\"caf\xe9\"", "line 1, column 5", "invalid UTF-8");
  fails("\"\xed\xa0\x80\"", "line 1, column 2", "invalid UTF-8");  // a surrogate written in UTF-8
  fails("\"\\ud83d\"", "line 1, column 2", "high surrogate without a low one");
  fails("{\"x\": \"ab\\ud800\\u0041cd\"}", "line 1, column 10", "high surrogate without a low one");
  fails("\"\\ude00\"", "line 1, column 2", "low surrogate");
  fails("\"\\u12g4\"", "line 1, column 6", "four hexadecimal digits");
  fails("\"\\x41\"", "line 1, column 3", "unknown escape");
  fails("tru", "line 1, column 1", "expected a value");
  fails("NaN", "line 1, column 1", "expected a value");
  fails(std::string(600, '[') + std::string(600, ']'), "line 1, column 513", "nested deeper than 512");
}

}  // namespace
}  // namespace gpt::json
