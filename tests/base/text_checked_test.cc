// base/text.h (quoting user-supplied text in messages) and base/checked.h (size arithmetic that
// never wraps).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "base/checked.h"
#include "base/text.h"

namespace metaload {
namespace {

using namespace std::string_literals;

TEST(Text, ANulOrNewlineIsEscapedNeverPassedThrough) {
  const std::string name = "w\0x"s;
  EXPECT_EQ(quote_text(name), "\"w\\x00x\"");
  EXPECT_EQ(escape_text(name), "w\\x00x");
  // A name cannot forge a line of a message that lists one problem per line.
  EXPECT_EQ(escape_text("a\n  missing: b"), "a\\n  missing: b");
  EXPECT_EQ(quote_text("tab\there\r\x7f"), "\"tab\\there\\r\\x7f\"");
  EXPECT_EQ(quote_text("q\"b\\s"), "\"q\\\"b\\\\s\"");
  EXPECT_EQ(escape_text("q\"b"), "q\"b");  // unquoted: only quote_text() escapes the quote
  EXPECT_EQ(quote_text("it's \"x\"", '\''), "'it\\'s \"x\"'");
}

TEST(Text, NonAsciiIsShownAsCodePointsAndOtherBytesAsHex) {
  EXPECT_EQ(quote_text("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\\u00e9 \\u20ac \\U0001f600\"");
  EXPECT_EQ(quote_text("a\xff"
                       "b"),
            "\"a\\xffb\"");
  EXPECT_EQ(quote_text("\xc0\xaf"), "\"\\xc0\\xaf\"");           // an overlong '/'
  EXPECT_EQ(quote_text("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\"");  // a surrogate
  EXPECT_EQ(quote_text("\xc2\x85"), "\"\\u0085\"");              // a C1 control (NEL)
}

TEST(Text, NamesThatDifferOnlyInNormalisationPrintApart) {
  // Precomposed e-acute and e + combining acute, the Kelvin sign and K, Hangul syllable and
  // conjoining jamo, a zero-width joiner: each pair renders alike, never prints alike.
  const std::vector<std::pair<std::string, std::string>> twins = {
      {"caf\xc3\xa9", "cafe\xcc\x81"},
      {"\xe2\x84\xaa", "K"},
      {"\xea\xb0\x80", "\xe1\x84\x80\xe1\x85\xa1"},
      {"ab",
       "a\xe2\x80\x8d"
       "b"},
  };
  for (const auto& [a, b] : twins) {
    EXPECT_NE(quote_text(a), quote_text(b));
    EXPECT_NE(escape_path(a), escape_path(b));
  }
  EXPECT_EQ(quote_text("cafe\xcc\x81"), "\"cafe\\u0301\"");
  EXPECT_EQ(escape_text("\xe2\x84\xaa"), "\\u212a");
}

TEST(Text, Utf8SafeEscapesOnlyBytesThatAreNotUtf8) {
  EXPECT_EQ(utf8_safe("plain \xc3\xa9 text"), "plain \xc3\xa9 text");  // valid: unchanged
  EXPECT_EQ(utf8_safe("a\xff"
                      "b\xc0\xaf\xed\xa0\x80\xe2\x82"),
            "a\\xffb\\xc0\\xaf\\xed\\xa0\\x80\\xe2\\x82");
  EXPECT_EQ(utf8_safe(""), "");
}

TEST(Text, LongValuesAreCutAtACharacterWithTheirSize) {
  const std::string big(10 << 20, 'a');
  const std::string q = quote_text(big);
  EXPECT_EQ(q, "\"" + std::string(kQuoteMaxChars, 'a') + "...\" (10485760 bytes)");
  EXPECT_EQ(escape_text(big, 3), "aaa... (10485760 bytes)");
  EXPECT_EQ(quote_text(std::string(kQuoteMaxChars, 'b')),
            "\"" + std::string(kQuoteMaxChars, 'b') + "\"");
  // Multi-byte characters count as one and are never split.
  std::string euros;
  for (int i = 0; i < 5; ++i) euros += "\xe2\x82\xac";
  EXPECT_EQ(quote_text(euros, '"', 2), "\"\\u20ac\\u20ac...\" (15 bytes)");
}

TEST(Text, LongPathsLoseTheirMiddleNeverTheirFileName) {
  // A Bazel sandbox path is longer than kQuoteMaxChars: it stays whole up to head + tail.
  const std::string sandbox = "/root/.cache/bazel/" + std::string(300, 's') + "/model.safetensors";
  EXPECT_EQ(escape_path(sandbox), sandbox);
  const std::string deep = "/data/" + std::string(5000, 'd') + "/shard-\n\x01.safetensors";
  const std::string p = escape_path(deep);
  EXPECT_EQ(p.rfind("/data/ddd", 0), 0u) << p;
  EXPECT_NE(p.find("ddd...ddd"), std::string::npos) << p;
  EXPECT_NE(p.find("/shard-\\n\\x01.safetensors (" + std::to_string(deep.size()) + " bytes)"),
            std::string::npos)
      << p;
  EXPECT_LT(p.size(), kPathHeadChars + kPathTailChars + 40);
  // Control characters are escaped as everywhere; the tail starts after a character, never
  // inside one (the cut here falls on the euro sign's second byte).
  EXPECT_EQ(escape_path("a\nb"), "a\\nb");
  const std::string cut =
      escape_path(std::string(600, 'a') + "\xe2\x82\xac" + std::string(398, 'b'));
  EXPECT_NE(cut.find("a..." + std::string(398, 'b') + " (1001 bytes)"), std::string::npos) << cut;
  EXPECT_EQ(cut.find("\\x"), std::string::npos) << cut;
  // Quoted: the quote inside is escaped, the cut stays inside the quotes.
  EXPECT_EQ(quote_path("/a/\"b\""), "\"/a/\\\"b\\\"\"");
  const std::string quoted = quote_path(deep, '\'');
  EXPECT_EQ(quoted.front(), '\'');
  EXPECT_EQ(quoted.back(), '\'');
  EXPECT_NE(quoted.find(".safetensors (" + std::to_string(deep.size()) + " bytes)'"),
            std::string::npos)
      << quoted;
}

TEST(Text, ListsKeepTheFirstItemsAndSayHowManyMore) {
  std::vector<std::string> items;
  for (int i = 0; i < 100000; ++i) items.push_back("t" + std::to_string(i));
  const std::string s = capped_list(items);
  EXPECT_EQ(s.rfind("t0, t1, ", 0), 0u);
  EXPECT_NE(s.find("t19, ... and 99980 more"), std::string::npos);
  EXPECT_EQ(s.find("t20"), std::string::npos);
  EXPECT_LT(s.size(), 300u);
  EXPECT_EQ(capped_list({"a", "b"}), "a, b");
  EXPECT_EQ(and_more(20), "");
  EXPECT_EQ(and_more(21), "... and 1 more");
}

TEST(Checked, ProductsAndSumsThatFitAreExact) {
  EXPECT_EQ(checked_mul<uint64_t>(1ull << 32, (1ull << 32) - 1, "x"),
            (1ull << 32) * ((1ull << 32) - 1));
  EXPECT_EQ(checked_add<uint64_t>(std::numeric_limits<uint64_t>::max() - 1, 1, "x"),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(checked_product<uint64_t>({2, 3, 4}, 4, "x"), 96u);
  EXPECT_EQ(checked_product<uint64_t>({}, 2, "x"), 2u);
  EXPECT_EQ(product_or_none<uint64_t>({0, -1}), std::nullopt);
  EXPECT_EQ(mul_or_none<int64_t>(std::numeric_limits<int64_t>::max(), 2), std::nullopt);
}

TEST(Checked, AnOverflowNamesTheQuantityAndItsOperands) {
  try {
    checked_add<uint64_t>(std::numeric_limits<uint64_t>::max(), 2,
                          "total output bytes of the scan");
    FAIL() << "no error";
  } catch (const SizeOverflowError& e) {
    EXPECT_STREQ(e.kind(), "SizeOverflowError");
    EXPECT_EQ(e.message(),
              "total output bytes of the scan: 18446744073709551615 + 2 overflows (more than "
              "2^64-1)");
  }
  try {
    checked_product<uint64_t>({44000000000, 1024, 50257, 1000}, 4, "bytes of \"lm_head\"");
    FAIL() << "no error";
  } catch (const SizeOverflowError& e) {
    EXPECT_EQ(e.message(),
              "bytes of \"lm_head\": [44000000000, 1024, 50257, 1000] x 4 overflows (more than "
              "2^64-1)");
  }
  try {
    checked_mul<int64_t>(int64_t{1} << 40, int64_t{1} << 30, "n_inner");
    FAIL() << "no error";
  } catch (const SizeOverflowError& e) {
    EXPECT_NE(e.message().find("overflows (more than 2^63-1)"), std::string::npos) << e.message();
  }
  EXPECT_THROW(checked_product<uint64_t>({2, -3}, 1, "x"), SizeOverflowError);
}

TEST(Text, ShapesPrintAsTorchPrintsThem) {
  EXPECT_EQ(shape_str(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(shape_str(std::vector<int64_t>{2, 3}), "[2, 3]");
  EXPECT_EQ(shape_str(std::vector<int64_t>{-1, int64_t{1} << 40}), "[-1, 1099511627776]");
  EXPECT_EQ(shape_str(std::vector<int>{7}), "[7]");
}

TEST(Text, EndsWithComparesTheTailOnly) {
  EXPECT_TRUE(ends_with("model.safetensors", ".safetensors"));
  EXPECT_TRUE(ends_with("x", ""));
  EXPECT_FALSE(ends_with("safetensors", ".safetensors"));
  EXPECT_FALSE(ends_with("a.safetensors.tmp", ".safetensors"));
}

}  // namespace
}  // namespace metaload
