// Fuzzes chat-template rendering (lib/template/*): random conversations (roles, contents, loss flags, BOS/EOS
// texts, generation prompt) through every template family; checks the segment invariants render() promises.

#include "fuzz_util.h"
#include "template/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace swiftcpp;
  static const std::vector<std::string> names = chat_template_names();
  static const char* const kRoles[] = {"system", "user", "assistant", "tool", "", "User"};
  fuzz::ByteReader in(data, size);
  const std::string name = names[in.integer_in<size_t>(0, names.size() - 1)];
  TemplateTokens tokens;
  if (in.boolean()) tokens.bos_token = in.string(16);
  if (in.boolean()) tokens.eos_token = in.string(16);
  const bool generation_prompt = in.boolean();
  std::vector<ChatMessage> messages(in.integer_in<size_t>(0, 8));
  for (auto& m : messages) {
    m.role = kRoles[in.integer_in<size_t>(0, 5)];
    const int loss = in.integer_in<int>(0, 2);
    if (loss < 2) m.loss = loss == 1;
    m.content = in.string(256);
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
