// Strict typed configuration: recipes and key=value overrides, with errors naming file:line or the argument.
#include <gtest/gtest.h>

#include "config/schema.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

struct Example {
  std::string model = "models/stories260K";
  std::vector<std::string> dataset;
  int64_t max_steps = -1;
  double learning_rate = 1e-4;
  bool dataset_shuffle = true;
  std::string train_type = "lora";
};

const ConfigSchema<Example>& schema() {
  static const ConfigSchema<Example> s = ConfigSchema<Example>()
      .string("model", &Example::model, "model folder")
      .strings("dataset", &Example::dataset, "dataset files path[#N]")
      .integer("max_steps", &Example::max_steps, "steps (-1: epochs decide)", -1)
      .number("learning_rate", &Example::learning_rate, "AdamW learning rate", 0.0, 10.0)
      .boolean("dataset_shuffle", &Example::dataset_shuffle, "shuffle rows")
      .string("train_type", &Example::train_type, "tuning method", {"full", "lora", "dora"});
  return s;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

fs::path recipe(const std::string& name, const std::string& text) {
  const fs::path path = test::temp_dir("config_" + name) / "recipe.yaml";
  write_file_atomic(path, text);
  return path;
}

TEST(Config, RecipeAndOverridesDecodeIntoTheStruct) {
  Example e;
  schema().apply_file(e, recipe("ok", "model: m\ndataset: [a.jsonl, b.json#10]\nmax_steps: 5\ntrain_type: full\n"));
  schema().apply_override(e, "learning_rate=3e-5");
  schema().apply_override(e, "dataset=c.jsonl");
  EXPECT_EQ(e.model, "m");
  EXPECT_EQ(e.dataset, std::vector<std::string>{"c.jsonl"});
  EXPECT_EQ(e.max_steps, 5);
  EXPECT_DOUBLE_EQ(e.learning_rate, 3e-5);
  EXPECT_EQ(e.train_type, "full");
  const Json dumped = schema().dump(e);
  EXPECT_EQ(dumped["max_steps"], 5);
  EXPECT_EQ(dumped["dataset"], Json::array({"c.jsonl"}));
  EXPECT_NE(schema().help().find("learning_rate"), std::string::npos);
}

TEST(Config, UnknownKeysWrongTypesAndRangesNameFileAndLine) {
  Example e;
  const fs::path p = recipe("bad_key", "model: m\n\nlerning_rate: 0.1\n");
  std::string msg = error_of([&] { schema().apply_file(e, p); });
  EXPECT_NE(msg.find(p.string() + ":3: unknown key 'lerning_rate' (did you mean 'learning_rate'?)"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_file(e, recipe("bad_type", "max_steps: ten\n")); });
  EXPECT_NE(msg.find(":1: 'max_steps' must be an integer, got 'ten'"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_file(e, recipe("bad_range", "model: m\nlearning_rate: -1\n")); });
  EXPECT_NE(msg.find(":2: 'learning_rate' must be in [0, 10]"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_file(e, recipe("bad_choice", "train_type: qlora\n")); });
  EXPECT_NE(msg.find("must be one of full, lora, dora, got 'qlora'"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_file(e, recipe("twice", "model: a\nmodel: b\n")); });
  EXPECT_NE(msg.find(":2: key 'model' is given twice"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_file(e, recipe("yaml", "model: [a\n")); });
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_override(e, "max_step=3"); });
  EXPECT_NE(msg.find("command line 'max_step=3': unknown key 'max_step' (did you mean 'max_steps'?)"), std::string::npos) << msg;
  msg = error_of([&] { schema().apply_override(e, "dataset_shuffle=maybe"); });
  EXPECT_NE(msg.find("'dataset_shuffle' must be true or false"), std::string::npos) << msg;
  EXPECT_THROW(schema().apply_override(e, "novalue"), ConfigError);
}

}  // namespace
}  // namespace swiftcpp
