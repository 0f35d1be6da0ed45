// Fuzzes chat-template rendering (lib/template/*): random conversations (roles, contents, loss flags, BOS/EOS
// texts, generation prompt) through every template family; checks the segment invariants render() promises.
#include <fuzzer/FuzzedDataProvider.h>

#include "fuzz_util.h"
#include "template/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  static const std::vector<std::string> names = chat_template_names();
  static const char* const kRoles[] = {"system", "user", "assistant", "tool", "", "User"};
  FuzzedDataProvider in(data, size);
  const std::string name = names[in.ConsumeIntegralInRange<size_t>(0, names.size() - 1)];
  TemplateTokens tokens;
  if (in.ConsumeBool()) tokens.bos_token = in.ConsumeRandomLengthString(16);
  if (in.ConsumeBool()) tokens.eos_token = in.ConsumeRandomLengthString(16);
  const bool generation_prompt = in.ConsumeBool();
  std::vector<ChatMessage> messages(in.ConsumeIntegralInRange<size_t>(0, 8));
  for (auto& m : messages) {
    m.role = kRoles[in.ConsumeIntegralInRange<size_t>(0, 5)];
    const int loss = in.ConsumeIntegralInRange<int>(0, 2);
    if (loss < 2) m.loss = loss == 1;
    m.content = in.ConsumeRandomLengthString(256);
  }
  fuzz::expect_clean([&] {
    const auto templ = make_chat_template(name, tokens);
    const auto segments = templ->render(messages, generation_prompt);
    std::string joined;
    for (size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].text.empty()) std::abort();
      if (i > 0 && segments[i].trainable == segments[i - 1].trainable) std::abort();
      joined += segments[i].text;
    }
    if (joined != templ->render_text(messages, generation_prompt)) std::abort();
  });
  return 0;
}
