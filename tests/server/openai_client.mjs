// The official OpenAI SDK (npm package `openai`) against a running `sluice serve`:
//   node openai_client.mjs BASE_URL API_KEY
// completions, chat, streamed chat with usage, stop strings, and a bad request that must come
// back as a 400 with OpenAI's error shape. Prints what it checked; exits 1 at the first failure.
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const model = (await client.models.list()).data[0].id;

function check(ok, what, got) {
  if (!ok) {
    console.error(`FAIL ${what}: got ${JSON.stringify(got)}`);
    process.exit(1);
  }
  console.log(`ok   ${what}`);
}

const usageOk = (u) =>
  u && u.prompt_tokens > 0 && u.completion_tokens > 0 &&
  u.total_tokens === u.prompt_tokens + u.completion_tokens;

const completion = await client.completions.create({
  model, prompt: "The whale", max_tokens: 12, temperature: 0,
});
check(typeof completion.choices[0].text === "string" && completion.choices[0].text.length > 0,
      "completions.create returns text", completion);
check(["stop", "length"].includes(completion.choices[0].finish_reason), "completion finish_reason",
      completion.choices[0]);
check(usageOk(completion.usage), "completion usage", completion.usage);

const messages = [{ role: "user", content: "Tell me about the sea" }];
const chat = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0,
});
const answer = chat.choices[0].message.content;
check(chat.choices[0].message.role === "assistant" && typeof answer === "string",
      "chat.completions.create returns an assistant message", chat.choices[0]);
check(usageOk(chat.usage), "chat usage", chat.usage);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
let streamed = "", streamUsage = null, finish = null;
for await (const chunk of stream) {
  if (chunk.usage) streamUsage = chunk.usage;
  for (const c of chunk.choices) {
    streamed += c.delta?.content ?? "";
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(streamed === answer, "streamed chat equals the whole answer", { streamed, answer });
check(finish === chat.choices[0].finish_reason, "streamed finish_reason", finish);
check(usageOk(streamUsage) && streamUsage.completion_tokens === chat.usage.completion_tokens,
      "streamed usage (stream_options.include_usage)", streamUsage);

const free = await client.completions.create({
  model, prompt: "The sea", max_tokens: 24, temperature: 0,
});
const text = free.choices[0].text;
check(text.length >= 8, "a text long enough to pick a stop string from", text);
const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
const stopped = await client.completions.create({
  model, prompt: "The sea", max_tokens: 24, temperature: 0, stop: [stop],
});
check(stopped.choices[0].text === text.slice(0, text.indexOf(stop)) &&
      stopped.choices[0].finish_reason === "stop", "stop strings cut the text", stopped.choices[0]);

try {
  await client.completions.create({ model, prompt: "x", temperature: -1 });
  check(false, "an invalid request fails", "a completion");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400, "invalid request: 400",
        { status: e.status, name: e.constructor.name });
  check(typeof e.error?.message === "string" && e.error.type === "invalid_request_error" &&
        "param" in e.error && "code" in e.error, "invalid request: OpenAI's error shape", e.error);
}
console.log("all checks passed");
