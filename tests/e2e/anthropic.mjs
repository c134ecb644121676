// anthropic.mjs - the official `@anthropic-ai/sdk` npm client against
// lmserv serve's Messages API: text (the prompt and reply chat completions
// give for the same conversation), system prompts, streaming through the
// client's MessageStream, stop sequences and max_tokens, a forced tool call
// and the tool_result turn after it, count_tokens, and errors mapped to the
// client's error classes (the key sent as x-api-key, as the client does).
//
// env: BASE (http://127.0.0.1:PORT), API_KEY (the server's key)
import Anthropic from '@anthropic-ai/sdk';

const BASE = process.env.BASE;
const KEY = process.env.API_KEY;
const client = new Anthropic({ baseURL: BASE, apiKey: KEY, maxRetries: 0, timeout: 30000 });
let pass = 0;
const failures = [];

function ok(cond, what) {
    if (cond) pass++;
    else failures.push(what);
}

async function status(promise) {
    try {
        await promise;
        return { status: 200 };
    } catch (e) {
        return e instanceof Anthropic.APIError ? { status: e.status, err: e } : { status: -1, err: e };
    }
}

// chat completions over plain HTTP, for the reference prompt and reply
async function chat(body) {
    const r = await fetch(`${BASE}/v1/chat/completions`, {
        method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify(body),
    });
    return r.json();
}

const model = 'stories260K';
const messages = [{ role: 'user', content: 'Tell me a story' }];

async function text() {
    const m = await client.messages.create({ model, max_tokens: 16, temperature: 0, messages });
    const ref = await chat({ model, messages, max_tokens: 16, temperature: 0 });
    ok(m.type === 'message' && m.role === 'assistant' && m.id.startsWith('msg_'), 'a message object');
    ok(m.content.length === 1 && m.content[0].type === 'text' && m.content[0].text === ref.choices[0].message.content,
       `the text chat completions gives (${JSON.stringify(m.content)})`);
    ok(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0) === ref.usage.prompt_tokens && m.usage.output_tokens === 16,
       `usage (${JSON.stringify(m.usage)} vs ${ref.usage.prompt_tokens})`);
    ok(m.stop_reason === 'max_tokens' && m.stop_sequence === null, `stop_reason max_tokens (${m.stop_reason})`);
    // system as a string and as text blocks: the same prompt as chat's system message
    const sys = await client.messages.create({ model, max_tokens: 4, temperature: 0, system: 'Be brief', messages });
    const sysb = await client.messages.create({ model, max_tokens: 4, temperature: 0,
        system: [{ type: 'text', text: 'Be brief' }], messages });
    const cs = await chat({ model, messages: [{ role: 'system', content: 'Be brief' }, ...messages], max_tokens: 4, temperature: 0 });
    const inTok = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);
    ok(inTok(sys.usage) === cs.usage.prompt_tokens && inTok(sysb.usage) === cs.usage.prompt_tokens &&
       sys.content[0].text === cs.choices[0].message.content, 'system prompt: rendered as chat renders it');
    const n = await client.messages.countTokens({ model, system: 'Be brief', messages });
    ok(n.input_tokens === cs.usage.prompt_tokens, `count_tokens (${n.input_tokens} vs ${cs.usage.prompt_tokens})`);
    // streamed through the client's MessageStream: the same text
    const stream = client.messages.stream({ model, max_tokens: 16, temperature: 0, messages });
    let pieces = '';
    stream.on('text', (t) => { pieces += t; });
    const fm = await stream.finalMessage();
    ok(pieces === m.content[0].text && fm.content[0].text === m.content[0].text && fm.stop_reason === 'max_tokens' &&
       fm.usage.output_tokens === 16, `streamed: the same text and stop (${JSON.stringify(pieces)})`);
    // a stop sequence from the reply's own text
    const word = m.content[0].text.trim().split(/\s+/)[1];
    const st = await client.messages.create({ model, max_tokens: 16, temperature: 0, messages, stop_sequences: ['zzz', word] });
    ok(st.stop_reason === 'stop_sequence' && st.stop_sequence === word && !st.content[0].text.includes(word),
       `stop_sequences: stop_reason and which (${st.stop_reason} ${st.stop_sequence})`);
}

async function tools() {
    const weather = { name: 'get_weather', description: 'Weather of a city',
        input_schema: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] } }, required: ['city'] } };
    const m = await client.messages.create({ model, max_tokens: 250, messages: [{ role: 'user', content: 'weather?' }],
        tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' } });
    const use = m.content.find((b) => b.type === 'tool_use');
    ok(m.stop_reason === 'tool_use' && use && use.name === 'get_weather' && ['Paris', 'Rome'].includes(use.input.city) &&
       use.id.startsWith('toolu_'), `a forced call is a tool_use block (${JSON.stringify(m.content)})`);
    // the next turn: tool_use and tool_result, rendered as chat's tool turn
    const follow = [{ role: 'user', content: 'weather?' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_1', content: 'sunny' }] }];
    const ctools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: weather.input_schema } }];
    const cmsgs = [{ role: 'user', content: 'weather?' }, { role: 'assistant', content: '', tool_calls: [{ id: 'call_1',
        type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }];
    const f = await client.messages.create({ model, max_tokens: 4, temperature: 0, messages: follow, tools: [weather] });
    const cf = await chat({ model, messages: cmsgs, tools: ctools, max_tokens: 4, temperature: 0 });
    ok(f.usage.input_tokens + (f.usage.cache_read_input_tokens ?? 0) === cf.usage.prompt_tokens,
       `tool_use and tool_result rendered as chat's tool turn (${JSON.stringify(f.usage)} vs ${cf.usage.prompt_tokens})`);
}

async function errors() {
    let e = await status(client.messages.create({ model, messages }));
    ok(e.status === 400 && e.err instanceof Anthropic.BadRequestError && /max_tokens/.test(e.err.message),
       `no max_tokens: 400 (${e.status})`);
    e = await status(client.messages.create({ model: 'nope', max_tokens: 4, messages }));
    ok(e.status === 404 && e.err instanceof Anthropic.NotFoundError, `unknown model: 404 (${e.status})`);
    e = await status(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image',
        source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }));
    ok(e.status === 400 && /image/.test(e.err.message), `an image block refused naming it (${e.status})`);
    e = await status(client.messages.create({ model, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }));
    ok(e.status === 400 && e.err.error?.error?.type === 'invalid_request_error', `a system role in messages: 400 (${e.status})`);
    const bad = new Anthropic({ baseURL: BASE, apiKey: 'wrong', maxRetries: 0 });
    e = await status(bad.messages.create({ model, max_tokens: 4, messages }));
    ok(e.status === 401 && e.err instanceof Anthropic.AuthenticationError, `wrong key: 401 (${e.status})`);
}

try {
    await text();
    await tools();
    await errors();
} catch (e) {
    failures.push(`exception: ${e.stack ?? e}`);
}
for (const f of failures) console.log(`  not ok: ${f}`);
console.log(`anthropic.mjs: ${pass} passed, ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);
