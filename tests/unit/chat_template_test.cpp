// Real chat templates from /work/shared/data/tokenizers, rendered for multi-turn conversations.
// Every expected string was worked out by hand from reading the template (which branch each
// message takes, what whitespace control leaves), not produced by this code.
#include "io/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace sluice {
namespace {

using ojson = nlohmann::ordered_json;

const std::filesystem::path kTokenizers = SLUICE_SOURCE_DIR "/../shared/data/tokenizers";

#define SKIP_WITHOUT_SHARED_DATA()                                                \
  if (!std::filesystem::exists(kTokenizers)) {                                    \
    GTEST_SKIP() << "shared tokenizer data not found at " << kTokenizers.string() \
                 << " (needs the /work/shared checkout next to the repository)";  \
  }

ChatTemplate config_template(const std::string& relative) {
  return ChatTemplate::from_tokenizer_config(kTokenizers / relative);
}

ChatTemplate jinja_file(const std::string& relative) {
  std::ifstream in(kTokenizers / relative, std::ios::binary);
  std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(source.empty()) << relative;
  return ChatTemplate::parse(source, relative);
}

ojson msg(const std::string& role, const std::string& content) {
  return ojson{{"role", role}, {"content", content}};
}

// system, user, assistant, user: the conversation most tests render.
ojson chat_with_system() {
  return ojson::array({msg("system", "You are terse."), msg("user", "Hi"),
                       msg("assistant", "Hello!"), msg("user", "2+2?")});
}

ojson weather_tool() {
  ojson properties = ojson::object();
  properties["city"] = ojson{{"type", "string"}};
  ojson parameters = ojson::object();
  parameters["type"] = "object";
  parameters["properties"] = properties;
  ojson function = ojson::object();
  function["name"] = "get_weather";
  function["description"] = "Get weather";
  function["parameters"] = parameters;
  ojson tool = ojson::object();
  tool["type"] = "function";
  tool["function"] = function;
  return tool;
}

std::string error_of(const ChatTemplate& t, const ojson& messages,
                     const ojson& extra = ojson::object()) {
  try {
    t.render(messages, false, extra);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- Mixtral-8x7B-Instruct / Mistral-7B-Instruct-v0.2 ----

TEST(ChatTemplate, MixtralInstruct) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("mixtral/tokenizer_config.json");
  ojson chat = ojson::array({msg("user", "Hi"), msg("assistant", "Hello!"), msg("user", "2+2?")});
  const std::string expected = "<s>[INST] Hi [/INST]Hello!</s>[INST] 2+2? [/INST]";
  EXPECT_EQ(t.render(chat, false), expected);
  EXPECT_EQ(t.render(chat, true), expected);  // the template ignores add_generation_prompt
}

TEST(ChatTemplate, MixtralInstructRejectsBadRoles) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("mixtral/tokenizer_config.json");
  std::string alternate = error_of(t, chat_with_system());
  EXPECT_NE(alternate.find("template raised an exception: Conversation roles must alternate "
                           "user/assistant/user/assistant/..."),
            std::string::npos)
      << alternate;
  EXPECT_EQ(alternate.rfind((kTokenizers / "mixtral/tokenizer_config.json").string() +
                                ": field 'chat_template':1:",
                            0),
            0u)
      << alternate;
  std::string roles = error_of(t, ojson::array({msg("user", "a"), msg("system", "b")}));
  EXPECT_NE(roles.find("Only user and assistant roles are supported!"), std::string::npos) << roles;
}

// ---- Mistral-7B-Instruct-v0.3 (v3 tokenizer, Mixtral-8x22B family): system, tools, tool calls
// ----

TEST(ChatTemplate, MistralV3SystemGoesIntoLastUserTurn) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("mixtral/v3-32768/tokenizer_config.json");
  EXPECT_EQ(t.render(chat_with_system(), true),
            "<s>[INST] Hi[/INST] Hello!</s>[INST] You are terse.\n\n2+2?[/INST]");
}

TEST(ChatTemplate, MistralV3Tools) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("mixtral/v3-32768/tokenizer_config.json");
  EXPECT_EQ(t.render(ojson::array({msg("user", "Weather in Paris?")}), true,
                     ojson{{"tools", ojson::array({weather_tool()})}}),
            "<s>[AVAILABLE_TOOLS] [{\"type\": \"function\", \"function\": {\"name\": "
            "\"get_weather\", \"description\": \"Get weather\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}]"
            "[/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]");
}

ojson mistral_tool_call(const std::string& id) {
  ojson function = ojson::object();
  function["name"] = "get_weather";
  function["arguments"] = ojson{{"city", "Paris"}};
  ojson call = ojson::object();
  call["id"] = id;
  call["function"] = function;
  ojson assistant = ojson::object();
  assistant["role"] = "assistant";
  assistant["tool_calls"] = ojson::array({call});
  ojson tool = ojson::object();
  tool["role"] = "tool";
  tool["tool_call_id"] = id;
  tool["content"] = "22C";
  return ojson::array({msg("user", "Q"), assistant, tool, msg("assistant", "It is 22C.")});
}

TEST(ChatTemplate, MistralV3ToolCallsAndResults) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("mixtral/v3-32768/tokenizer_config.json");
  EXPECT_EQ(t.render(mistral_tool_call("abc123def"), false),
            "<s>[INST] Q[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}, \"id\": \"abc123def\"}]</s>[TOOL_RESULTS] {\"content\": 22C, "
            "\"call_id\": \"abc123def\"}[/TOOL_RESULTS] It is 22C.</s>");
  std::string bad_id = error_of(t, mistral_tool_call("short"));
  EXPECT_NE(bad_id.find("Tool call IDs should be alphanumeric strings with length 9!"),
            std::string::npos)
      << bad_id;
  std::string alternate = error_of(t, ojson::array({msg("user", "a"), msg("user", "b")}));
  EXPECT_NE(alternate.find("After the optional system message, conversation roles must alternate"),
            std::string::npos)
      << alternate;
}

// ---- Qwen2.5 ----

TEST(ChatTemplate, Qwen25) {
  SKIP_WITHOUT_SHARED_DATA();
  for (ChatTemplate t : {config_template("qwen/tokenizer_config.qwen2.5.json"),
                         jinja_file("qwen/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja")}) {
    EXPECT_EQ(t.render(chat_with_system(), true),
              "<|im_start|>system\nYou are terse.<|im_end|>\n"
              "<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\nHello!<|im_end|>\n"
              "<|im_start|>user\n2+2?<|im_end|>\n"
              "<|im_start|>assistant\n")
        << t.origin();
    // Without a system message the template supplies its default one.
    EXPECT_EQ(t.render(ojson::array({msg("user", "Hi")}), false),
              "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
              "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
        << t.origin();
  }
}

TEST(ChatTemplate, Qwen25ToolsAndToolCalls) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("qwen/tokenizer_config.qwen2.5.json");
  ojson call = ojson::object();
  call["type"] = "function";
  call["function"] = ojson{{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}};
  ojson assistant = ojson::object();
  assistant["role"] = "assistant";
  assistant["content"] = "";
  assistant["tool_calls"] = ojson::array({call});
  ojson chat = ojson::array(
      {msg("system", "You are terse."), msg("user", "Weather?"), assistant, msg("tool", "22C")});
  EXPECT_EQ(t.render(chat, true, ojson{{"tools", ojson::array({weather_tool()})}}),
            "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions "
            "to assist with the user query.\n\nYou are provided with function signatures within "
            "<tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
            "\"Get weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
            "{\"type\": \"string\"}}}}}\n</tools>\n\nFor each function call, return a json object "
            "with function name and arguments within <tool_call></tool_call> XML tags:\n"
            "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
            "</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

// ---- Qwen3 (and the Qwen3-0.6B file), QwQ, Qwen3-Coder ----

TEST(ChatTemplate, Qwen3DropsPastReasoning) {
  SKIP_WITHOUT_SHARED_DATA();
  ojson chat =
      ojson::array({msg("system", "You are terse."), msg("user", "Hi"),
                    msg("assistant", "<think>\nhmm\n</think>\n\nHello!"), msg("user", "2+2?")});
  const std::string history =
      "<|im_start|>system\nYou are terse.<|im_end|>\n"
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello!<|im_end|>\n"
      "<|im_start|>user\n2+2?<|im_end|>\n";
  for (ChatTemplate t : {config_template("qwen/tokenizer_config.qwen3.json"),
                         jinja_file("qwen/chat_templates/Qwen-Qwen3-0.6B.jinja")}) {
    EXPECT_EQ(t.render(chat, false), history) << t.origin();
    EXPECT_EQ(t.render(chat, true), history + "<|im_start|>assistant\n") << t.origin();
    EXPECT_EQ(t.render(chat, true, ojson{{"enable_thinking", false}}),
              history + "<|im_start|>assistant\n<think>\n\n</think>\n\n")
        << t.origin();
  }
}

TEST(ChatTemplate, Qwen3KeepsReasoningAfterLastQuery) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("qwen/tokenizer_config.qwen3.json");
  ojson chat = ojson::array({msg("user", "Hi"), msg("assistant", "<think>\nr\n</think>\n\nA")});
  EXPECT_EQ(t.render(chat, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA"
            "<|im_end|>\n");
}

TEST(ChatTemplate, QwQ) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("qwen/chat_templates/Qwen-QwQ-32B.jinja");
  ojson chat = ojson::array({msg("system", "You are terse."), msg("user", "Hi"),
                             msg("assistant", "<think>r</think>\nHello!"), msg("user", "2+2?")});
  EXPECT_EQ(t.render(chat, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n</think>");
}

TEST(ChatTemplate, Qwen3Coder) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("qwen/chat_templates/Qwen3-Coder.jinja");
  EXPECT_EQ(t.render(chat_with_system(), true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");

  ojson call = ojson::object();
  call["function"] = ojson{{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}};
  ojson assistant = ojson::object();
  assistant["role"] = "assistant";
  assistant["tool_calls"] = ojson::array({call});
  ojson chat = ojson::array({msg("user", "Q"), assistant, msg("tool", "22C")});
  EXPECT_EQ(t.render(chat, false),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\n22C\n</tool_response>\n<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3CoderToolDescriptions) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("qwen/chat_templates/Qwen3-Coder.jinja");
  ojson tool = weather_tool();
  tool["function"]["description"] = "Get weather ";  // trimmed by the template
  tool["function"]["parameters"]["properties"]["city"]["description"] = "City";
  tool["function"]["parameters"]["required"] = ojson::array({"city"});
  EXPECT_EQ(
      t.render(ojson::array({msg("user", "Hi")}), true, ojson{{"tools", ojson::array({tool})}}),
      "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer "
      "to solve tasks.\n\n# Tools\n\nYou have access to the following tools:\n\n<tools>"
      "\n<function>\n<name>get_weather</name>\n<description>Get weather</description>"
      "\n<parameters>\n<parameter>\n<name>city</name>\n<type>string</type>"
      "\n<description>City</description>\n</parameter>\n<required>[\"city\"]</required>"
      "\n</parameters>\n</function>\n</tools>"
      "\n\nIf you choose to call a tool ONLY reply in the following format with NO suffix:\n\n"
      "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
      "</parameter>\n<parameter=example_parameter_2>\nvalue_2\n</parameter>\n</function>\n"
      "</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: "
      "the tool calling block MUST begin with an opening <tool_call> tag and end with a closing "
      "</tool_call> tag.\n- Required parameters MUST be specified\n- You may provide optional "
      "reasoning for your function call in natural language BEFORE the function call, but NOT "
      "after\n- If there is no function call available, answer the question like normal with "
      "your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
      "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// ---- DeepSeek-V3 / R1 / V3.1 / V3.2 ----

const char* const kBos = "<｜begin▁of▁sentence｜>";

TEST(ChatTemplate, DeepSeekV3) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("deepseek/tokenizer_config.deepseek-v3.json");
  EXPECT_EQ(t.special_tokens()["bos_token"], kBos);  // read from an AddedToken object
  const std::string history = std::string(kBos) +
                              "You are terse.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
                              "<｜User｜>2+2?";
  EXPECT_EQ(t.render(chat_with_system(), false), history);
  EXPECT_EQ(t.render(chat_with_system(), true), history + "<｜Assistant｜>");
  // Several system messages are joined with a blank line.
  ojson two_systems = ojson::array({msg("system", "A"), msg("system", "B"), msg("user", "Hi")});
  EXPECT_EQ(t.render(two_systems, false), std::string(kBos) + "A\n\nB<｜User｜>Hi");
}

TEST(ChatTemplate, DeepSeekR1) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = config_template("deepseek/tokenizer_config.deepseek-r1.json");
  ojson chat = ojson::array({msg("system", "You are terse."), msg("user", "Hi"),
                             msg("assistant", "<think>x</think>Hello!"), msg("user", "2+2?")});
  EXPECT_EQ(t.render(chat, true),
            std::string(kBos) +
                "You are terse.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜>"
                "<｜User｜>2+2?<｜Assistant｜><think>\n");
}

TEST(ChatTemplate, DeepSeekR1LlamaCppVariantWithMacroAndTools) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("deepseek/chat_templates/llama-cpp-deepseek-r1.jinja");
  ojson bos = {{"bos_token", kBos}};
  EXPECT_EQ(t.render(chat_with_system(), true, bos),
            std::string(kBos) +
                "You are terse.<｜User｜>Hi<｜end▁of▁sentence｜><｜Assistant｜>Hello!"
                "<｜end▁of▁sentence｜><｜User｜>2+2?<｜end▁of▁sentence｜><｜Assistant｜><think>\n");
  ojson tool = ojson::object();
  tool["type"] = "function";
  ojson function = ojson::object();
  function["name"] = "get_weather";
  function["parameters"] = ojson{{"type", "object"}};
  tool["function"] = function;
  // With tools it fails as it does under transformers: `tools | map(...)` is a generator, which
  // json.dumps (tojson) refuses. llama.cpp's own engine returns a list there.
  ojson extra = {{"bos_token", kBos}, {"tools", ojson::array({tool})}};
  try {
    t.render(ojson::array({msg("user", "Hi")}), true, extra);
    ADD_FAILURE() << "rendered tools, which Jinja2 refuses";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Object of type generator is not JSON serializable"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, DeepSeekV31) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("deepseek/chat_templates/deepseek-ai-DeepSeek-V3.1.jinja");
  const std::string history = std::string(kBos) +
                              "You are terse.<｜User｜>Hi<｜Assistant｜><think></think>Hello!"
                              "<｜end▁of▁sentence｜><｜User｜>2+2?";
  EXPECT_EQ(t.render(chat_with_system(), false, {{"bos_token", kBos}}), history);
  EXPECT_EQ(t.render(chat_with_system(), true, {{"bos_token", kBos}}),
            history + "<｜Assistant｜><think></think>");
  EXPECT_EQ(t.render(chat_with_system(), true, {{"bos_token", kBos}, {"thinking", true}}),
            history + "<｜Assistant｜><think>");
}

TEST(ChatTemplate, DeepSeekV32) {
  SKIP_WITHOUT_SHARED_DATA();
  ChatTemplate t = jinja_file("deepseek/chat_templates/deepseek-ai-DeepSeek-V3.2.jinja");
  EXPECT_EQ(t.render(chat_with_system(), true, {{"bos_token", kBos}}),
            std::string(kBos) +
                "You are terse.<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜>"
                "<｜User｜>2+2?<｜Assistant｜><think></think>");

  ojson call = ojson::object();
  call["type"] = "function";
  call["function"] =
      ojson{{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\", \"days\": 2}"}};
  ojson assistant = ojson::object();
  assistant["role"] = "assistant";
  assistant["content"] = "";
  assistant["tool_calls"] = ojson::array({call});
  ojson chat = ojson::array({msg("user", "Weather?"), assistant, msg("tool", "22C")});
  EXPECT_EQ(t.render(chat, true, {{"bos_token", kBos}}),
            std::string(kBos) +
                "<｜User｜>Weather?<｜Assistant｜></think>\n\n<｜DSML｜function_calls>\n"
                "<｜DSML｜invoke name=\"get_weather\">\n"
                "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>"
                "\n\n<function_results>\n<result>22C</result>\n</function_results>"
                "\n\n<think></think>");
}

// ---- tokenizer_config.json handling ----

TEST(ChatTemplate, ConfigWithoutTemplateIsAnError) {
  SKIP_WITHOUT_SHARED_DATA();
  const auto path = kTokenizers / "mixtral/mistral-7b-v0.1-hf-nonlegacy/tokenizer_config.json";
  try {
    ChatTemplate::from_tokenizer_config(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path.string() +
                  ": field 'chat_template': expected a string or a list of {name, "
                  "template}, got nothing (and no chat_template.jinja next to it)");
  }
}

TEST(ChatTemplate, NamedTemplateListPicksDefault) {
  const testing::TempDir dir;
  const auto path = dir / "tokenizer_config.json";
  {
    std::ofstream out(path);
    out << R"({"bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>",
              "chat_template": [{"name": "tool_use", "template": "tools"},
                                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}]})";
  }
  ChatTemplate t = ChatTemplate::from_tokenizer_config(path);
  EXPECT_EQ(t.render(nlohmann::json::array({{{"role", "user"}, {"content", "x"}}}), false),
            "<B>x<E>");
}

}  // namespace
}  // namespace sluice
