#include "server/openai_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/model_chat_template.h"
#include "server/peer_watch.h"
#include "server/request_state.h"

namespace sluice::server {
namespace {

using Json = nlohmann::ordered_json;

// OpenAI's error body; `type` as OpenAI spells it ("invalid_request_error", ...).
void send_error(httplib::Response& res, int status, const std::string& message, const char* type,
                Json param = nullptr, Json code = nullptr) {
  Json body = {{"error", {{"message", message}, {"type", type}, {"param", param}, {"code", code}}}};
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_json(httplib::Response& res, const Json& body) {
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

Json usage_json(const RequestState& s) {
  return {{"prompt_tokens", s.prompt_tokens()},
          {"completion_tokens", s.completion_tokens()},
          {"total_tokens", s.prompt_tokens() + s.completion_tokens()}};
}

// One streamed event: "data: <json>\n\n".
bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string event = "data: " + data + "\n\n";
  return sink.write(event.data(), event.size());
}

}  // namespace

struct OpenAiServer::Impl {
  ServedModel model;
  OnlineSession& session;
  ServerOptions o;
  httplib::Server http;
  int listen_socket = -1;
  std::atomic<bool> listening{false}, stopping{false};
  std::atomic<uint64_t> next_seed{1};  // requests without a seed draw different numbers

  Impl(ServedModel m, OnlineSession& s, ServerOptions options)
      : model(std::move(m)), session(s), o(std::move(options)) {}

  // One token's logprob entry of the chat format.
  Json chat_logprob(int token, float logprob) const {
    const std::string bytes = model.tokenizer->decode_bytes(std::vector<int32_t>{token});
    return {{"token", model.tokenizer->decode(std::vector<int32_t>{token})},
            {"logprob", logprob},
            {"bytes", std::vector<unsigned char>(bytes.begin(), bytes.end())}};
  }

  // The choice's "logprobs": chat's {"content": [...]}, or the legacy completions' parallel lists
  // (text_offset counted from the start of the completion's text).
  Json logprobs_json(CompletionCall& call, const std::vector<TokenLogprob>& lps) const {
    if (call.top_logprobs < 0) return nullptr;
    if (call.chat) {
      Json content = Json::array();
      for (const TokenLogprob& t : lps) {
        Json e = chat_logprob(t.token, t.logprob);
        e["top_logprobs"] = Json::array();
        for (const auto& [id, lp] : t.top) e["top_logprobs"].push_back(chat_logprob(id, lp));
        content.push_back(std::move(e));
      }
      return {{"content", std::move(content)}};
    }
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
         offsets = Json::array();
    for (const TokenLogprob& t : lps) {
      const std::string text = model.tokenizer->decode(std::vector<int32_t>{t.token});
      tokens.push_back(text);
      token_logprobs.push_back(t.logprob);
      Json alternatives = Json::object();
      for (const auto& [id, lp] : t.top)  // two tokens of one text: the likelier one's
        alternatives.emplace(model.tokenizer->decode(std::vector<int32_t>{id}), lp);
      top.push_back(std::move(alternatives));
      offsets.push_back(call.text_offset);
      call.text_offset += text.size();
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top)},
            {"text_offset", std::move(offsets)}};
  }

  Json choice(const CompletionCall& call, const std::string& text, Json finish,
              Json logprobs = nullptr) const {
    Json c = {{"index", 0}};
    if (call.chat && call.stream)
      c["delta"] = text.empty() && !finish.is_null() ? Json::object() : Json{{"content", text}};
    else if (call.chat)
      c["message"] = {{"role", "assistant"}, {"content", text}};
    else
      c["text"] = text;
    c["logprobs"] = std::move(logprobs);
    c["finish_reason"] = finish;
    return c;
  }

  Json envelope(const CompletionCall& call, Json choices) const {
    const char* object = call.chat ? (call.stream ? "chat.completion.chunk" : "chat.completion")
                                   : "text_completion";
    return {{"id", call.id},
            {"object", object},
            {"created", call.created},
            {"model", o.model_name},
            {"choices", std::move(choices)}};
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat);
  void respond_whole(CompletionCall& call, RequestState& state, int64_t id,
                     const httplib::Request& req, httplib::Response& res);
  void respond_stream(CompletionCall call, std::shared_ptr<RequestState> state,
                      int64_t id, httplib::Response& res);
  void tokenize(const httplib::Request& req, httplib::Response& res);
  void detokenize(const httplib::Request& req, httplib::Response& res);
  void apply_template(const httplib::Request& req, httplib::Response& res);
  void metrics(httplib::Response& res);
};

void OpenAiServer::Impl::complete(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto parsed = parse_completion(req.body, chat, model, o.max_tokens_default,
                                 next_seed++ * 0x9E3779B97F4A7C15ull);
  if (const auto* e = std::get_if<ApiError>(&parsed))
    return send_error(res, e->status, e->message, e->type.c_str(), e->param, e->code);
  auto& [call, r, stop] = std::get<CompletionRequest>(parsed);
  auto state = std::make_shared<RequestState>(*model.tokenizer, stop);
  const OnlineSession::Submitted sub = session.submit(std::move(r), state);
  if (sub.admission == OnlineSession::Admission::kQueueFull)
    return send_error(res, 429, "the server's request queue is full; retry later", "requests",
                      nullptr, "queue_full");
  if (sub.admission == OnlineSession::Admission::kStopping)
    return send_error(res, 503, "the server is shutting down", "server_error", nullptr,
                      "shutting_down");
  call.id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", sub.id);
  call.created = int64_t(std::time(nullptr));
  if (call.stream) return respond_stream(call, state, sub.id, res);
  respond_whole(call, *state, sub.id, req, res);
}

void OpenAiServer::Impl::respond_whole(CompletionCall& call, RequestState& state, int64_t id,
                                       const httplib::Request& req, httplib::Response& res) {
  // A client that hangs up before its answer frees its sequence, as a streaming one does.
  const PeerWatch peer(req);
  const RequestState::Delta whole = state.wait_whole([&] { return peer.gone(); });
  if (!whole.done) {
    session.cancel(id);
    return;
  }
  if (state.finish_reason() == "error")
    return send_error(res, 503, state.error(), "server_error");
  Json body = envelope(call, Json::array({choice(call, whole.text, state.finish_reason(),
                                                 logprobs_json(call, whole.logprobs))}));
  body["usage"] = usage_json(state);
  send_json(res, body);
}

void OpenAiServer::Impl::respond_stream(CompletionCall call,
                                        std::shared_ptr<RequestState> state, int64_t id,
                                        httplib::Response& res) {
  auto provider = [this, call = std::move(call), state](size_t, httplib::DataSink& sink) mutable {
    auto event = [&](Json choices, bool with_usage) {
      Json chunk = envelope(call, std::move(choices));
      if (call.include_usage) chunk["usage"] = with_usage ? usage_json(*state) : Json();
      return write_event(sink, chunk.dump(-1, ' ', false, Json::error_handler_t::replace));
    };
    if (call.chat) {
      Json first = choice(call, "", nullptr);
      first["delta"] = {{"role", "assistant"}, {"content", ""}};
      if (!event(Json::array({first}), false)) return false;
    }
    for (;;) {
      RequestState::Delta d = state->next_delta(1000);
      // A comment line when there is nothing to send: a client that went away is noticed.
      // (A request that asked for no logprobs gets none in its deltas.)
      const bool news = !d.text.empty() || !d.logprobs.empty();
      const bool alive =
          news ? event(Json::array({choice(call, d.text, nullptr, logprobs_json(call, d.logprobs))}),
                       false)
               : sink.write(":\n\n", 3);
      if (!alive) return false;
      if (!d.done) continue;
      if (state->finish_reason() == "error") {
        Json err = {{"error", {{"message", state->error()}, {"type", "server_error"},
                               {"param", nullptr}, {"code", nullptr}}}};
        write_event(sink, err.dump());
      } else {
        if (!event(Json::array({choice(call, "", state->finish_reason())}), false)) return false;
        if (call.include_usage && !event(Json::array(), true)) return false;
      }
      write_event(sink, "[DONE]");
      sink.done();
      return true;
    }
  };
  // Called once the stream ends; without success the client went away: free its sequence.
  auto release = [this, id](bool success) {
    if (!success) session.cancel(id);
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", provider, release);
}

void OpenAiServer::Impl::tokenize(const httplib::Request& req, httplib::Response& res) {
  Json body = Json::parse(req.body, nullptr, false);
  if (!body.is_object() || !body.contains("prompt") || !body["prompt"].is_string())
    return send_error(res, 400, "expected a JSON object {\"prompt\": string}",
                      "invalid_request_error", "prompt");
  std::vector<int32_t> ids = model.tokenizer->encode(body["prompt"].get<std::string>());
  send_json(res, {{"tokens", ids},
                  {"count", ids.size()},
                  {"max_model_len", model.config->max_position_embeddings}});
}

void OpenAiServer::Impl::detokenize(const httplib::Request& req, httplib::Response& res) {
  Json body = Json::parse(req.body, nullptr, false);
  const char* expected = "expected a JSON object {\"tokens\": [token ids]}";
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    return send_error(res, 400, expected, "invalid_request_error", "tokens");
  std::vector<int32_t> ids;
  for (const Json& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= model.config->vocab_size)
      return send_error(res, 400,
                        fmt::format("field 'tokens': expected token ids in [0, {}), got {}",
                                    model.config->vocab_size, t.dump()),
                        "invalid_request_error", "tokens");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  send_json(res, {{"prompt", model.tokenizer->decode(ids)}});
}

// The prompt the chat template makes, as `sluice chat-template` prints it:
// {"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool (default true)}
// -> {"prompt": "..."}.
void OpenAiServer::Impl::apply_template(const httplib::Request& req, httplib::Response& res) {
  if (!model.prompter)
    return send_error(res, 400, model.prompter_error, "invalid_request_error", "messages");
  const Json body = Json::parse(req.body, nullptr, false);
  if (!body.is_object() || !body.contains("messages") || !body["messages"].is_array())
    return send_error(res, 400, "expected a JSON object {\"messages\": [messages], \"tools\": "
                      "[tool schemas] (optional), \"add_generation_prompt\": bool (optional)}",
                      "invalid_request_error", "messages");
  const Json tools = body.value("tools", Json());
  if (!tools.is_null() && !tools.is_array())
    return send_error(res, 400, "field 'tools': expected a list of tool schemas",
                      "invalid_request_error", "tools");
  const Json generation_prompt = body.value("add_generation_prompt", Json(true));
  if (!generation_prompt.is_boolean())
    return send_error(res, 400, "field 'add_generation_prompt': expected true or false",
                      "invalid_request_error", "add_generation_prompt");
  try {
    const std::string prompt = render_chat_prompt(model.prompter->chat_template(),
                                                  body["messages"], tools,
                                                  generation_prompt.get<bool>());
    send_json(res, {{"prompt", prompt}});
  } catch (const Error& e) {
    send_error(res, 400, fmt::format("the chat template failed: {}", e.what()),
               "invalid_request_error", "messages");
  }
}

void OpenAiServer::Impl::metrics(httplib::Response& res) {
  const OnlineMetrics m = session.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    out += fmt::format("# HELP sluice_{0} {1}\n# TYPE sluice_{0} {2}\nsluice_{0} {3}\n", name, help,
                       type, value);
  };
  metric("requests_accepted_total", "counter", "Completion requests admitted.",
         double(m.requests_accepted));
  metric("requests_rejected_total", "counter", "Requests refused because the queue was full.",
         double(m.requests_rejected));
  metric("requests_finished_total", "counter", "Requests finished (or failed).",
         double(m.requests_finished));
  metric("requests_cancelled_total", "counter", "Requests dropped because the client went away.",
         double(m.requests_cancelled));
  metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
         double(m.prompt_tokens));
  metric("generation_tokens_total", "counter", "Tokens generated for finished requests.",
         double(m.generated_tokens));
  metric("steps_total", "counter", "Engine steps run.", double(m.steps));
  metric("step_seconds_total", "counter", "Seconds spent in engine steps.", m.step_seconds_sum);
  metric("last_step_seconds", "gauge", "Duration of the latest engine step.", m.last_step_seconds);
  metric("running_sequences_step_total", "counter",
         "Running sequences summed over steps (divide by steps_total: the mean batch).",
         double(m.running_sum));
  metric("running_sequences", "gauge", "Sequences in the running batch.", double(m.running));
  metric("queue_depth", "gauge", "Requests waiting for a slot.", double(m.waiting));
  metric("kv_cache_usage_ratio", "gauge", "KV-cache blocks in use over all blocks.", m.kv_usage);
  res.set_content(out, "text/plain; version=0.0.4");
}

OpenAiServer::OpenAiServer(ServedModel model, OnlineSession& session, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), session, std::move(options))) {
  add_routes();
}

OpenAiServer::~OpenAiServer() = default;

void OpenAiServer::add_routes() {
  Impl& m = *impl_;
  const int threads = m.o.http_threads;
  m.http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  m.http.set_payload_max_length(m.o.max_body_bytes);
  m.http.set_pre_routing_handler([&m](const httplib::Request& req, httplib::Response& res) {
    if (m.o.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + m.o.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "missing or wrong API key (expected the header 'Authorization: Bearer "
                         "<key>' with the server's --api-key)",
               "invalid_request_error", nullptr, "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  m.http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413)
      return send_error(res, 413, "the request body is larger than the server accepts",
                        "invalid_request_error");
    if (res.status == 404)
      return send_error(res, 404, fmt::format("no endpoint {} {}", req.method, req.path),
                        "invalid_request_error");
    send_error(res, res.status, fmt::format("HTTP status {}", res.status), "invalid_request_error");
  });
  m.http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          what = x.what();
        } catch (...) {
        }
        send_error(res, 500, what, "server_error");
      });
  m.http.Post("/v1/completions", [&m](const httplib::Request& req, httplib::Response& res) {
    m.complete(req, res, false);
  });
  m.http.Post("/v1/chat/completions", [&m](const httplib::Request& req, httplib::Response& res) {
    m.complete(req, res, true);
  });
  m.http.Get("/v1/models", [&m](const httplib::Request&, httplib::Response& res) {
    Json model = {{"id", m.o.model_name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "sluice"},
                  {"max_model_len", m.model.config->max_position_embeddings}};
    send_json(res, {{"object", "list"}, {"data", Json::array({model})}});
  });
  m.http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"status", "ok"}});
  });
  m.http.Get("/metrics", [&m](const httplib::Request&, httplib::Response& res) { m.metrics(res); });
  m.http.Post("/tokenize", [&m](const httplib::Request& req, httplib::Response& res) {
    m.tokenize(req, res);
  });
  m.http.Post("/detokenize", [&m](const httplib::Request& req, httplib::Response& res) {
    m.detokenize(req, res);
  });
  m.http.Post("/apply-template", [&m](const httplib::Request& req, httplib::Response& res) {
    m.apply_template(req, res);
  });
}

// Debian's httplib is a compiled library that listens with a backlog of 5 connections, whatever
// CPPHTTPLIB_LISTEN_BACKLOG says here: a burst of clients connecting at once overflowed the accept
// queue, and some of them saw their connection closed without an answer. The listening socket is
// therefore listened on again with a deep backlog (Linux then only updates the backlog). The
// socket options are also ours: SO_REUSEADDR only, where httplib sets SO_REUSEPORT, which lets a
// second server bind the same port and silently take half of its connections.
constexpr int kListenBacklog = 1024;

void OpenAiServer::bind() {
  Impl& m = *impl_;
  m.http.set_socket_options([&m](int socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    m.listen_socket = socket;
  });
  if (m.o.port == 0) {
    port_ = m.http.bind_to_any_port(m.o.host);
    if (port_ < 0) fail("serve: cannot bind to {} on any port", m.o.host);
  } else {
    if (!m.http.bind_to_port(m.o.host, m.o.port))
      fail("serve: cannot bind to {}:{} (in use, or not an address of this machine)", m.o.host,
           m.o.port);
    port_ = m.o.port;
  }
  if (::listen(m.listen_socket, kListenBacklog) != 0)
    fail("serve: cannot deepen the listen backlog of {}:{} to {} connections: {}", m.o.host, port_,
         kListenBacklog, std::strerror(errno));
}

// httplib's stop() does nothing until listen() has started its loop, so a stop() that came first
// (a SIGTERM right after start) would leave listen() serving for ever. listen() therefore says
// that it is listening before it looks at `stopping`, and stop() says that it is stopping before it
// looks at `listening`: either listen() sees the stop and returns, or stop() sees listen() and
// repeats httplib's stop() until listen() has returned.
void OpenAiServer::listen() {
  Impl& m = *impl_;
  m.listening = true;
  if (!m.stopping) m.http.listen_after_bind();
  m.listening = false;
}

void OpenAiServer::stop() {
  Impl& m = *impl_;
  m.stopping = true;
  while (m.listening) {
    if (m.http.is_running()) m.http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace sluice::server
