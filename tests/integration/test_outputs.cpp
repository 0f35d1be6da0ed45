// Outputs are never half-written and never replace anything but a regular file; inputs must be regular files.
// Every writer (AtomicFile and write_file_atomic, safetensors, GGUF, checkpoint folders, train checkpoints, the
// data cache, infer/eval/export/quantize outputs) is checked to leave an existing output intact and no temporary
// file behind when it fails, and the CLI to refuse devices, FIFOs, symbolic link loops and paths under a regular
// file with a clean error naming the path. Every CLI run has a time limit, so a FIFO cannot hang the suite.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "core/fs.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace swiftcpp {
namespace {

using test::run_cli;
using test::stories_dir;

// Names in `dir` (not recursive), so a test can see that no temporary file or folder was left behind.
std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

fs::path make_fifo(const fs::path& path) {
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0) << path;
  return path;
}

bool names_a_fifo(const fs::path& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// The swiftcpp binary under a 30 s limit (exit 124 if it hangs).
test::CliRun run_limited(const std::string& args) { return run_cli(args, "timeout 30"); }

std::string stories() { return stories_dir().string(); }

// ---------------------------------------------------------------------------------------------------------------
// The helpers of lib/core/fs.h
// ---------------------------------------------------------------------------------------------------------------

TEST(Outputs, AtomicFileRefusesADestinationThatIsNotARegularFile) {
  const fs::path dir = test::temp_dir("outputs_refuse");
  const fs::path fifo = make_fifo(dir / "fifo");
  fs::create_directories(dir / "folder");
  fs::create_symlink("/dev/null", dir / "null");  // followed: a character device
  test::expect_error<IoError>([&] { write_file_atomic(fifo, "x"); }, {"fifo", "a FIFO, not a regular file"});
  test::expect_error<IoError>([&] { write_file_atomic(dir / "folder", "x"); }, {"folder", "a folder"});
  test::expect_error<IoError>([&] { write_file_atomic(dir / "null", "x"); }, {"null", "a character device"});
  EXPECT_TRUE(names_a_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(dir / "null"));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"fifo", "folder", "null"}));
}

TEST(Outputs, AtomicFileChecksTheDestinationAgainAtCommit) {
  const fs::path dir = test::temp_dir("outputs_recheck");
  {
    AtomicFile file(dir / "out.txt");
    file.stream() << "new";
    make_fifo(dir / "out.txt");  // appears while the file is written
    test::expect_error<IoError>([&] { file.commit(); }, {"out.txt", "a FIFO"});
  }
  EXPECT_TRUE(names_a_fifo(dir / "out.txt"));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out.txt"}));
}

TEST(Outputs, AnAbandonedAtomicFileLeavesTheOldFileAndNoTemporaryFile) {
  const fs::path dir = test::temp_dir("outputs_abandoned");
  write_file_atomic(dir / "out.txt", "old");
  try {
    AtomicFile file(dir / "out.txt");
    file.stream() << "half of the new cont";
    throw std::runtime_error("interrupted");  // as a failure half way through a writer
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(read_text_file(dir / "out.txt"), "old");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out.txt"}));
  write_file_atomic(dir / "out.txt", "new");
  EXPECT_EQ(read_text_file(dir / "out.txt"), "new");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out.txt"}));
}

TEST(Outputs, AnOutputUnderARegularFileIsAnIoErrorNamingTheFile) {
  const fs::path dir = test::temp_dir("outputs_under_file");
  write_file_atomic(dir / "plain", "x");
  test::expect_error<IoError>([&] { write_file_atomic(dir / "plain" / "x.txt", "y"); },
                              {(dir / "plain" / "x.txt").string(), "'" + (dir / "plain").string() + "' is a regular file"});
  test::expect_error<IoError>([&] { create_folders(dir / "plain" / "a" / "b"); },
                              {(dir / "plain").string(), "not a folder"});
  test::expect_error<IoError>([&] { check_output_folder(dir / "plain", "--output"); }, {"plain", "not a folder"});
  EXPECT_EQ(read_text_file(dir / "plain"), "x");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"plain"}));
}

TEST(Inputs, OnlyRegularFilesAreRead) {
  const fs::path dir = test::temp_dir("inputs_regular");
  const fs::path fifo = make_fifo(dir / "fifo");
  fs::create_directories(dir / "folder");
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  write_file_atomic(dir / "plain", "text");
  test::expect_error<IoError>([&] { require_regular_file(fifo, "dataset"); }, {"dataset", "fifo", "a FIFO"});
  test::expect_error<IoError>([&] { require_regular_file("/dev/zero"); }, {"/dev/zero", "a character device"});
  test::expect_error<IoError>([&] { require_regular_file(dir / "folder"); }, {"folder", "a folder"});
  test::expect_error<IoError>([&] { require_regular_file(dir / "loop_a"); }, {"loop_a", "loop of symbolic links"});
  test::expect_error<IoError>([&] { require_regular_file(dir / "missing"); }, {"missing", "No such file"});
  test::expect_error<IoError>([&] { require_regular_file(dir / "plain" / "x"); }, {"plain", "not a folder"});
  require_regular_file(dir / "plain");
  EXPECT_EQ(read_text_file(dir / "plain"), "text");
  // read_text_file checks before it opens, so neither a device nor a FIFO is read (or waited on).
  test::expect_error<IoError>([&] { read_text_file("/dev/zero"); }, {"/dev/zero", "not a regular file"});
  test::expect_error<IoError>([&] { read_text_file(fifo); }, {"fifo", "not a regular file"});
  test::expect_error<IoError>([&] { read_text_file(dir / "folder"); }, {"folder", "a folder"});
  test::expect_error<IoError>([&] { read_text_file(dir / "loop_a"); }, {"loop_a", "loop of symbolic links"});
}

TEST(Outputs, ReplaceFolderSwapsAFolderInOneStepAndRefusesAFile) {
  const fs::path dir = test::temp_dir("outputs_replace_folder");
  fs::create_directories(dir / "out");
  write_file_atomic(dir / "out" / "old.txt", "old");
  fs::create_directories(dir / ".out.tmp");
  write_file_atomic(dir / ".out.tmp" / "new.txt", "new");
  replace_folder(dir / ".out.tmp", dir / "out");
  EXPECT_EQ(names_in(dir / "out"), (std::set<std::string>{"new.txt"}));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out"}));
  fs::create_directories(dir / ".b.tmp");
  write_file_atomic(dir / "b", "a file");
  test::expect_error<IoError>([&] { replace_folder(dir / ".b.tmp", dir / "b"); }, {"b", "a regular file, not a folder"});
  EXPECT_EQ(read_text_file(dir / "b"), "a file");
}

// ---------------------------------------------------------------------------------------------------------------
// The writers of lib/: failing on bad input, each leaves the old output and nothing else
// ---------------------------------------------------------------------------------------------------------------

TEST(Outputs, SafetensorsWriterFailingLeavesTheOldFile) {
  const fs::path dir = test::temp_dir("outputs_safetensors");
  const fs::path file = dir / "w.safetensors";
  save_safetensors(file, {{"a", at::ones({2})}});
  const std::string before = read_text_file(file);
  test::expect_error<FormatError>([&] { save_safetensors(file, {{"a", at::ones({2}, at::kComplexFloat)}}); },
                                  {"'a'", "cannot be stored"});
  test::expect_error<FormatError>([&] { save_safetensors(file, {{"a", at::ones({2})}}, {{"k", "\xff"}}); },
                                  {"UTF-8"});
  EXPECT_EQ(read_text_file(file), before);
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"w.safetensors"}));
}

TEST(Outputs, GgufWriterFailingHalfWayLeavesTheOldFile) {
  const fs::path dir = test::temp_dir("outputs_gguf");
  const fs::path file = dir / "m.gguf";
  GgufWriter good;
  good.set_string("general.name", "x");
  good.add_tensor("t", at::ones({32}), GgmlType::F32);
  good.write(file);
  const std::string before = read_text_file(file);
  GgufWriter bad;  // the second value does not fit its type: found while the header is being written
  bad.set_string("general.name", "y");
  bad.set("bad.value", {GgufType::STRING, GgufType::STRING, Json(1000)});
  bad.add_tensor("t", at::zeros({32}), GgmlType::F32);
  test::expect_error<ConfigError>([&] { bad.write(file); }, {"bad.value"});
  EXPECT_EQ(read_text_file(file), before);
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"m.gguf"}));
}

TEST(Outputs, CheckpointFolderWriterFailingLeavesTheOldFolder) {
  const fs::path dir = test::temp_dir("outputs_ckpt_folder");
  const fs::path out = dir / "out";
  write_checkpoint_folder(out, stories_dir(), {{"w", at::ones({2})}}, "{\"a\": 1}\n");
  const std::string weights = read_text_file(out / "model.safetensors");
  test::expect_error<FormatError>(
      [&] { write_checkpoint_folder(out, stories_dir(), {{"w", at::ones({2}, at::kComplexFloat)}}, "{\"a\": 2}\n"); },
      {"'w'"});
  EXPECT_EQ(read_text_file(out / "model.safetensors"), weights);
  EXPECT_EQ(read_text_file(out / "config.json"), "{\"a\": 1}\n");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out"}));
  // A trailing separator names the same folder (the temporary folder goes beside it, not inside).
  write_checkpoint_folder(dir / "out/", stories_dir(), {{"w", at::zeros({2})}}, "{\"a\": 3}\n");
  EXPECT_EQ(read_text_file(out / "config.json"), "{\"a\": 3}\n");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out"}));
  EXPECT_EQ(names_in(out).count("model.safetensors"), 1u);
  // Over a regular file it refuses, and the file stays.
  write_file_atomic(dir / "plain", "x");
  test::expect_error<IoError>([&] { write_checkpoint_folder(dir / "plain", stories_dir(), {{"w", at::ones({2})}}, "{}"); },
                              {"plain", "not a folder"});
  EXPECT_EQ(read_text_file(dir / "plain"), "x");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"out", "plain"}));
}

// ---------------------------------------------------------------------------------------------------------------
// The CLI: outputs
// ---------------------------------------------------------------------------------------------------------------

TEST(OutputsCli, InferAndEvalOutputsRefuseFifosDevicesAndPathsUnderAFile) {
  const fs::path dir = test::temp_dir("outputs_cli_infer");
  const fs::path fifo = make_fifo(dir / "fifo");
  fs::create_symlink("/dev/null", dir / "null");
  write_file_atomic(dir / "plain", "keep");
  write_file_atomic(dir / "in.jsonl", "{\"prompt\": \"Once\"}\n");
  write_file_atomic(dir / "ppl.txt", "Once upon a time there was a little girl. She liked to play.\n");
  const std::string logits = "--threads 1 infer --model " + stories() + " --prompt Once --max-new-tokens 1 --output-logits ";
  const std::string batch = "--threads 1 infer --model " + stories() + " --prompts-file " + (dir / "in.jsonl").string() +
                            " --max-new-tokens 1 --output ";
  const std::string eval = "--threads 1 eval --model " + stories() + " --tasks perplexity=" + (dir / "ppl.txt").string() +
                           " --max-length 64 --dump-requests ";
  for (const std::string& command : {logits, batch, eval}) {
    for (const fs::path& target : {fifo, dir / "null"}) {
      const auto r = run_limited(command + target.string());
      EXPECT_EQ(r.code, 3) << command << target << "\n" << r.out;
      EXPECT_NE(r.out.find("'" + target.string() + "'"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
    }
    const auto under = run_limited(command + (dir / "plain" / "x").string());
    EXPECT_EQ(under.code, 3) << under.out;
    EXPECT_NE(under.out.find("'" + (dir / "plain").string() + "' is a regular file, not a folder"), std::string::npos)
        << under.out;
  }
  EXPECT_TRUE(names_a_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(dir / "null"));
  EXPECT_EQ(read_text_file(dir / "plain"), "keep");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"fifo", "null", "plain", "in.jsonl", "ppl.txt"}));
  // An existing file is kept without --overwrite, replaced in one step with it.
  write_file_atomic(dir / "out.jsonl", "old\n");
  const auto kept = run_limited(batch + (dir / "out.jsonl").string());
  EXPECT_NE(kept.code, 0);
  EXPECT_NE(kept.out.find("exists (pass --overwrite"), std::string::npos) << kept.out;
  EXPECT_EQ(read_text_file(dir / "out.jsonl"), "old\n");
  const auto ok = run_limited(batch + (dir / "out.jsonl").string() + " --overwrite");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(read_text_file(dir / "out.jsonl").find("\"response\""), std::string::npos);
}

TEST(OutputsCli, EvalFailingOnBadInputLeavesEarlierResults) {
  const fs::path dir = test::temp_dir("outputs_cli_eval");
  write_file_atomic(dir / "ppl.txt", "Once upon a time there was a little girl. She liked to play.\n");
  const std::string eval = "--threads 1 eval --model " + stories() + " --max-length 64 --output-dir " +
                           (dir / "results").string() + " --dump-requests " + (dir / "requests.jsonl").string() +
                           " --tasks perplexity=";
  ASSERT_EQ(run_limited(eval + (dir / "ppl.txt").string()).code, 0);
  const std::string results = read_text_file(dir / "results" / "results.json");
  const std::string requests = read_text_file(dir / "requests.jsonl");
  // An existing results.json or requests file is refused before any work without --overwrite (one rule for every
  // writer), and with it a run that fails on bad input still leaves both as they were.
  const auto kept = run_limited(eval + (dir / "ppl.txt").string());
  EXPECT_NE(kept.code, 0);
  EXPECT_NE(kept.out.find("requests.jsonl exists (pass --overwrite"), std::string::npos) << kept.out;
  const auto kept_results = run_limited("--threads 1 eval --model " + stories() + " --max-length 64 --output-dir " +
                                        (dir / "results").string() + " --tasks perplexity=" + (dir / "ppl.txt").string());
  EXPECT_NE(kept_results.code, 0);
  EXPECT_NE(kept_results.out.find("results.json exists (pass --overwrite"), std::string::npos) << kept_results.out;
  const auto r = run_limited(eval + (dir / "missing.txt").string() + " --overwrite");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("missing.txt"), std::string::npos) << r.out;
  EXPECT_EQ(read_text_file(dir / "results" / "results.json"), results);
  EXPECT_EQ(read_text_file(dir / "requests.jsonl"), requests);
  EXPECT_EQ(names_in(dir / "results"), (std::set<std::string>{"results.json"}));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"ppl.txt", "requests.jsonl", "results"}));
}

TEST(OutputsCli, ExportAndQuantizeRefuseOutputsThatAreNotFoldersOrUnderAFile) {
  const fs::path dir = test::temp_dir("outputs_cli_export");
  const fs::path fifo = make_fifo(dir / "fifo");
  write_file_atomic(dir / "plain", "keep");
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  const std::string exp = "--threads 1 export --model " + stories() + " --overwrite --output ";
  const std::string gguf = "--threads 1 export --model " + stories() + " --format gguf --overwrite --output ";
  const std::string quant = "--threads 1 quantize --model " + stories() + " --overwrite --output ";
  struct Case {
    std::string command;
    fs::path output;
    std::string says;
  };
  const std::vector<Case> cases = {
      {exp, dir / "plain" / "hf", "'" + (dir / "plain").string() + "' is a regular file, not a folder"},
      {exp, dir / "plain", "a regular file, not a folder"},
      {exp, fifo, "a FIFO, not a folder"},
      {exp, dir / "loop_a", "loop of symbolic links"},
      {gguf, dir / "plain" / "m.gguf", "'" + (dir / "plain").string() + "' is a regular file, not a folder"},
      {gguf, fifo, "a FIFO, not a regular file"},
      {gguf, dir / "loop_a", "loop of symbolic links"},
      {quant, dir / "plain" / "q", "'" + (dir / "plain").string() + "' is a regular file, not a folder"},
      {quant, fifo, "a FIFO, not a folder"},
  };
  for (const Case& c : cases) {
    const auto r = run_limited(c.command + c.output.string());
    EXPECT_EQ(r.code, 3) << c.command << c.output << "\n" << r.out;
    EXPECT_NE(r.out.find(c.output.string()), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.says << "\n" << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  }
  EXPECT_TRUE(names_a_fifo(fifo));
  EXPECT_EQ(read_text_file(dir / "plain"), "keep");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"fifo", "plain", "loop_a", "loop_b"}));
}

TEST(OutputsCli, ExportOverwriteReplacesTheFolderInOneStep) {
  const fs::path dir = test::temp_dir("outputs_cli_overwrite");
  fs::create_directories(dir / "hf");
  write_file_atomic(dir / "hf" / "stale.txt", "from an earlier export");
  const auto refused = run_limited("--threads 1 export --model " + stories() + " --output " + (dir / "hf").string());
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_EQ(names_in(dir / "hf"), (std::set<std::string>{"stale.txt"}));
  const auto r = run_limited("--threads 1 export --model " + stories() + " --overwrite --output " + (dir / "hf/").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto files = names_in(dir / "hf");
  EXPECT_EQ(files.count("stale.txt"), 0u);
  EXPECT_EQ(files.count("model.safetensors"), 1u);
  EXPECT_EQ(files.count("config.json"), 1u);
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"hf"}));  // no temporary or old folder left beside it
}

TEST(OutputsCli, DataCacheUnderAFileIsACleanError) {
  const fs::path dir = test::temp_dir("outputs_cli_cache");
  write_file_atomic(dir / "plain", "keep");
  const std::string data = (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string() + "#8";
  const auto r = run_limited("--threads 1 data inspect --model " + stories() + " --dataset " + data + " --cache-dir " +
                             (dir / "plain" / "cache").string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("'" + (dir / "plain").string() + "' is a regular file, not a folder"), std::string::npos) << r.out;
  EXPECT_EQ(read_text_file(dir / "plain"), "keep");
  // A cache written once is reused; a FIFO in its place is neither read nor replaced.
  const std::string inspect = "--threads 1 data inspect --model " + stories() + " --dataset " + data + " --cache-dir " +
                              (dir / "cache").string();
  ASSERT_EQ(run_limited(inspect).code, 0);
  const auto cached = names_in(dir / "cache");
  ASSERT_EQ(cached.size(), 1u);
  const fs::path cache_file = dir / "cache" / *cached.begin();
  fs::remove(cache_file);
  make_fifo(cache_file);
  const auto refused = run_limited(inspect);
  EXPECT_EQ(refused.code, 3) << refused.out;
  EXPECT_NE(refused.out.find("a FIFO, not a regular file"), std::string::npos) << refused.out;
  EXPECT_TRUE(names_a_fifo(cache_file));
  EXPECT_EQ(names_in(dir / "cache").size(), 1u);
}

// A checkpoint that cannot be completed (here a model file that cannot be copied into it) leaves no checkpoint
// folder and no temporary folder: a resume can only find complete checkpoints.
TEST(OutputsCli, AFailedTrainCheckpointLeavesNothingBehind) {
  const fs::path dir = test::temp_dir("outputs_cli_train");
  const fs::path model = dir / "model";
  fs::create_directories(model);
  for (const auto& e : fs::directory_iterator(stories_dir())) fs::copy_file(e.path(), model / e.path().filename());
  fs::remove(model / "LICENSE");
  make_fifo(model / "LICENSE");  // copied into every full checkpoint
  const std::string data = (test::source_dir() / "tests/data/sft/alpaca_en_demo.json").string() + "#8";
  const auto r = run_limited(fmt::format(
      "--threads 1 train model={} dataset={} output_dir={} train_type=full max_length=64 per_device_train_batch_size=2 "
      "max_steps=2 save_steps=1 logging_steps=1 split_dataset_ratio=0 learning_rate=1e-3",
      model.string(), data, (dir / "out").string()));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LICENSE"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(dir / "out")) runs.push_back(e.path().filename().string());
  ASSERT_EQ(runs.size(), 1u);
  for (const auto& name : names_in(dir / "out" / runs[0])) {
    EXPECT_EQ(name.find("checkpoint"), std::string::npos) << name;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The CLI: inputs
// ---------------------------------------------------------------------------------------------------------------

TEST(InputsCli, DevicesFifosAndSymlinkLoopsAreRefusedNamingTheFile) {
  const fs::path dir = test::temp_dir("inputs_cli");
  const fs::path fifo = make_fifo(dir / "fifo");
  fs::create_symlink(dir / "loop_b", dir / "loop_a");
  fs::create_symlink(dir / "loop_a", dir / "loop_b");
  const std::string infer = "--threads 1 infer --model " + stories() + " --max-new-tokens 1 --output " +
                            (dir / "out.jsonl").string() + " --prompts-file ";
  const std::string inspect = "--threads 1 data inspect --model " + stories() + " --dataset ";
  const std::string eval = "--threads 1 eval --model " + stories() + " --max-length 64 --tasks perplexity=";
  for (const std::string& command : {infer, inspect, eval}) {
    for (const fs::path& input : {fifo, fs::path("/dev/zero")}) {
      const auto r = run_limited(command + input.string());
      EXPECT_EQ(r.code, 3) << command << input << "\n" << r.out;
      EXPECT_NE(r.out.find("'" + input.string() + "'"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
    }
  }
  // A model folder whose config.json is a FIFO or a symbolic link loop.
  const fs::path model = dir / "model";
  fs::create_directories(model);
  for (const auto& e : fs::directory_iterator(stories_dir())) fs::copy_file(e.path(), model / e.path().filename());
  fs::remove(model / "config.json");
  fs::create_symlink(model / "config.json", model / "config.json");
  auto r = run_limited("--threads 1 infer --model " + model.string() + " --prompt Once --max-new-tokens 1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("symbolic links"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
  fs::remove(model / "config.json");
  make_fifo(model / "config.json");
  r = run_limited("--threads 1 infer --model " + model.string() + " --prompt Once --max-new-tokens 1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a FIFO, not a regular file"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.jsonl"));
}

}  // namespace
}  // namespace swiftcpp
