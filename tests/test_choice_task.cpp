// Multiple-choice task files (data/choice_task.h) and the demo's task made from
// a corpus (data/ending_task.h): every bad line is one error naming file:line,
// and the generated questions are the held-out documents cut in two, with
// distinct distractors from the other held-out documents.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "meshtrain/data/choice_task.h"
#include "meshtrain/data/ending_task.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

struct TaskDir {
  fs::path path = fs::temp_directory_path() / fmt::format("meshtrain_choice_test_{}", ::getpid());
  TaskDir() { fs::create_directories(path); }
  ~TaskDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

std::string error_of(const std::string& path) {
  try {
    read_choice_task(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ChoiceTask, ReadsQuestions) {
  TaskDir d;
  const auto qs = read_choice_task(d.write("t.jsonl", R"({"context": "a b", "choices": [" c", " d e"], "answer": 1}
 
{"context": "", "choices": ["x", "y", "z"], "answer": 0}
)"));
  ASSERT_EQ(qs.size(), 2u);
  EXPECT_EQ(qs[0].context, "a b");
  EXPECT_EQ(qs[0].choices, (std::vector<std::string>{" c", " d e"}));
  EXPECT_EQ(qs[0].answer, 1);
  EXPECT_EQ(qs[0].line, 1);
  EXPECT_EQ(qs[1].line, 3);  // blank lines skipped, lines still counted
  EXPECT_EQ(qs[1].choices.size(), 3u);
}

TEST(ChoiceTask, EachBadLineIsOneErrorNamingFileAndLine) {
  TaskDir d;
  const std::string good = R"({"context": "a", "choices": [" b", " c"], "answer": 0})";
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"context": "a", "choices": [" b", " c"], "answer": 2})", "answer 2 is out of range: 2 choices, so 0..1"},
      {R"({"context": "a", "choices": [" b", " c"], "answer": -1})", "answer -1 is out of range"},
      {R"({"context": "a", "choices": [" b", " c"], "answer": 0.5})", "no whole-number \"answer\""},
      {R"({"context": "a", "choices": [" b"], "answer": 0})", "1 choice(s); a question needs at least two"},
      {R"({"context": "a", "choices": [" b", ""], "answer": 0})", "choice 1 is empty"},
      {R"({"context": "a", "choices": [" b", 3], "answer": 0})", "a choice that is not a string: 3"},
      {R"({"choices": [" b", " c"], "answer": 0})", "no string \"context\""},
      {R"({"context": "a", "answer": 0})", "no array \"choices\""},
      {R"({"prompt": "1+1=", "answer": "2"})", "meshtrain eval task"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"context": "a", )", "not JSON"},
  };
  for (const auto& [line, expected] : cases) {
    SCOPED_TRACE(line);
    const std::string path = d.write("bad.jsonl", good + "\n" + good + "\n" + line + "\n");
    const std::string e = error_of(path);
    EXPECT_NE(e.find(path + ":3: "), std::string::npos) << e;
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
  EXPECT_NE(error_of(d.write("empty.jsonl", "\n\n")).find("no questions"), std::string::npos);
  EXPECT_NE(error_of((d.path / "missing.jsonl").string()).find("not a readable file"), std::string::npos);
}

TEST(ChoiceTask, TokenizedLinesRoundTrip) {
  TokenizedChoice q;
  q.context = {2, 10, 11};
  q.choices = {{5}, {6, 7}};
  q.chars = {3, 9};
  q.answer = 1;
  q.line = 4;
  const auto back = parse_tokenized_choices(tokenized_choice_line(q) + "\n" + tokenized_choice_line(q) + "\n");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].context, q.context);
  EXPECT_EQ(back[1].choices, q.choices);
  EXPECT_EQ(back[1].chars, q.chars);
  EXPECT_EQ(back[1].answer, 1);
  EXPECT_EQ(back[1].line, 4);
  EXPECT_EQ(utf8_length("caf\xC3\xA9"), 4);  // é: two bytes, one character (Python's len)
  EXPECT_EQ(choice_task_name("data/kjv/ending.jsonl"), "ending");
}

std::vector<std::string> corpus(int n) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    std::string doc = fmt::format("verse{} opens", i);
    for (int w = 0; w < 6 + i % 7; ++w) doc += fmt::format(" w{}x{}", i, w);
    docs.push_back(doc);
  }
  return docs;
}

TEST(EndingTask, QuestionsAreHeldOutDocumentsCutInTwo) {
  const auto docs = corpus(1000);
  EndingTaskOptions o;
  o.held_out = 0.05;  // tokenize's --val-fraction 0.05: the last 50
  const HeldOut h = held_out_documents(docs, o.held_out);
  ASSERT_EQ(h.documents.size(), 50u);
  EXPECT_EQ(h.documents.front(), docs[950]);
  const EndingTask t = ending_task(h, o);
  EXPECT_EQ(t.documents, 1000);
  EXPECT_EQ(t.held_out, 50);
  ASSERT_EQ(t.items.size(), 50u);
  std::set<std::string> held(docs.begin() + 950, docs.end()), contexts;
  std::vector<int> places(4);
  for (const auto& q : t.items) {
    ASSERT_EQ(q.choices.size(), 4u);
    EXPECT_TRUE(held.count(q.context + q.choices[q.answer])) << q.context;  // the answer completes its document
    EXPECT_EQ(std::set<std::string>(q.choices.begin(), q.choices.end()).size(), 4u);  // distinct distractors
    for (const auto& c : q.choices) {
      EXPECT_EQ(c[0], ' ');
      EXPECT_NE(c.find(" w"), std::string::npos);
      const int from = std::stoi(c.substr(c.find(" w") + 2));
      EXPECT_GE(from, 950) << c;  // every ending from a held-out document
    }
    contexts.insert(q.context);
    ++places[q.answer];
  }
  EXPECT_EQ(contexts.size(), 50u);  // each held-out document asked once
  for (int p : places) EXPECT_GT(p, 0);  // the answer's place varies
  // A function of the seed.
  const EndingTask again = ending_task(h, o);
  EXPECT_EQ(again.items[7].choices, t.items[7].choices);
  o.seed = 2;
  EXPECT_NE(ending_task(h, o).items[0].context + ending_task(h, o).items[1].context,
            t.items[0].context + t.items[1].context);
}

TEST(EndingTask, StreamedHeldOutEqualsInMemoryAndShortOnesAreCounted) {
  TaskDir d;
  auto docs = corpus(500);
  docs[499] = "too short";
  std::string text;
  for (const auto& doc : docs) text += doc + "\n\n";  // blank lines between: skipped by the line rule
  const std::string path = d.write("c.txt", text);
  const HeldOut streamed = held_out_documents({path}, DocumentFormat{"auto", "text", "line"}, 0.01);
  const HeldOut memory = held_out_documents(docs, 0.01);
  EXPECT_EQ(streamed.total, 500);
  EXPECT_EQ(streamed.documents, memory.documents);
  EndingTaskOptions o;
  o.held_out = 0.01;
  const EndingTask t = ending_task(streamed, o);
  EXPECT_EQ(t.short_documents, 1);
  EXPECT_EQ(t.items.size(), 4u);
  o.questions = 2;
  EXPECT_EQ(ending_task(streamed, o).items.size(), 2u);
}

TEST(EndingTask, ShortagesAndBadOptionsAreNamed) {
  const auto docs = corpus(100);
  auto error = [&](EndingTaskOptions o, double fraction) -> std::string {
    try {
      ending_task(held_out_documents(docs, fraction), o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EndingTaskOptions o;
  EXPECT_NE(error(o, 0.01).find("1 held-out document(s) have at least 8 words; 4 choices"), std::string::npos);
  EXPECT_NE(error(o, 1.5).find("--held-out 1.5 must be in (0, 1)"), std::string::npos);
  o.choices = 1;
  EXPECT_NE(error(o, 0.1).find("--choices 1 must be at least 2"), std::string::npos);
  TaskDir d;
  const std::string out = d.write("exists.jsonl", "keep me\n");
  EXPECT_THROW(write_choice_task({}, out, false), std::invalid_argument);
  std::ifstream f(out);
  std::string kept;
  std::getline(f, kept);
  EXPECT_EQ(kept, "keep me");  // not overwritten
}

}  // namespace
}  // namespace meshtrain
