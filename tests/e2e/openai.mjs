// openai.mjs - the official `openai` npm client against lmserv serve:
// models, chat and completions (streamed and not, usage, logprobs, n > 1
// and several prompts), the Responses API (text, streamed events, JSON),
// embeddings (float and the client's default base64), and error statuses
// mapped to the client's error classes.
//
// env: BASE (http://127.0.0.1:PORT), API_KEY (the server's key)
import OpenAI from 'openai';

const BASE = process.env.BASE;
const KEY = process.env.API_KEY;
const client = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30000 });
let pass = 0;
const failures = [];

function ok(cond, what) {
    if (cond) pass++;
    else failures.push(what);
}

async function status(promise) {
    try {
        await promise;
        return 200;
    } catch (e) {
        return e instanceof OpenAI.APIError ? { status: e.status, err: e } : { status: -1, err: e };
    }
}

async function models() {
    const list = await client.models.list();
    const ids = list.data.map((m) => m.id);
    ok(ids.includes('stories260K'), `models list has stories260K: ${ids}`);
    const one = await client.models.retrieve('stories260K');
    ok(one.id === 'stories260K' && one.object === 'model', 'models.retrieve');
    return 'stories260K';
}

async function chat(model) {
    const req = { model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 16, temperature: 0 };
    const r = await client.chat.completions.create(req);
    ok(r.object === 'chat.completion', 'chat object');
    ok(r.choices.length === 1 && r.choices[0].message.role === 'assistant', 'chat message role');
    ok(typeof r.choices[0].message.content === 'string', 'chat content is a string');
    ok(['stop', 'length'].includes(r.choices[0].finish_reason), `chat finish_reason ${r.choices[0].finish_reason}`);
    const u = r.usage;
    ok(u.completion_tokens <= 16 && u.total_tokens === u.prompt_tokens + u.completion_tokens, 'chat usage');

    const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    let text = '', first = null, finish = null, usage = null;
    const ids = new Set();
    for await (const ch of stream) {
        ids.add(ch.id);
        if (ch.choices.length) {
            if (first === null) first = ch.choices[0].delta;
            text += ch.choices[0].delta.content ?? '';
            if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
        } else usage = ch.usage;
    }
    ok(first && first.role === 'assistant', 'stream starts with the assistant role');
    ok(ids.size === 1, 'one id per stream');
    ok(text === r.choices[0].message.content, `streamed text equals the non-streamed one (greedy): ${JSON.stringify(text)} vs ${JSON.stringify(r.choices[0].message.content)}`);
    ok(finish === r.choices[0].finish_reason, 'same finish_reason streamed');
    ok(usage && usage.completion_tokens === u.completion_tokens, 'include_usage chunk');

    const lp = await client.chat.completions.create({ ...req, logprobs: true, top_logprobs: 3 });
    const content = lp.choices[0].logprobs?.content ?? [];
    ok(content.length > 0 && content.length <= lp.usage.completion_tokens, 'logprobs per token');
    ok(content.every((t) => t.logprob <= 0 && Array.isArray(t.bytes) && t.top_logprobs.length === 3), 'top_logprobs');
    const ls = await client.chat.completions.create({ ...req, logprobs: true, top_logprobs: 2, stream: true });
    let n = 0, lpText = '';
    for await (const ch of ls) {
        const c = ch.choices[0];
        if (c?.logprobs?.content) {
            n += c.logprobs.content.length;
            lpText += c.logprobs.content.map((t) => t.token).join('');
        }
    }
    ok(n === content.length && lpText === content.map((t) => t.token).join(''), 'streamed logprobs match');
}

async function completions(model) {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
    ok(r.object === 'text_completion', 'completion object');
    ok(r.choices[0].text.startsWith(', there was a little girl'), `completion text: ${r.choices[0].text}`);
    const s = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true });
    let text = '';
    for await (const ch of s) text += ch.choices[0]?.text ?? '';
    ok(text === r.choices[0].text, 'streamed completion equals the non-streamed one');
}

// n > 1 and several prompts: one response of several choices
async function choices(model) {
    const req = { model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 8, n: 3, seed: 7 };
    const r = await client.chat.completions.create(req);
    ok(r.choices.length === 3 && r.choices.every((c, i) => c.index === i && c.message.role === 'assistant'), 'n=3: three choices in order');
    ok(r.usage.completion_tokens <= 24 && r.usage.completion_tokens >= 3, `n=3 usage counts every choice (${r.usage.completion_tokens})`);
    const single = await client.chat.completions.create({ ...req, n: 1 });
    ok(r.usage.prompt_tokens === single.usage.prompt_tokens, 'the prompt counted once');
    ok(single.choices[0].message.content === r.choices[0].message.content, 'choice 0 samples with the seed itself');
    const texts = ['', '', ''], finish = [null, null, null];
    let usage = null;
    const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
    for await (const ch of s) {
        if (!ch.choices.length) { usage = ch.usage; continue; }
        for (const c of ch.choices) {
            texts[c.index] += c.delta.content ?? '';
            if (c.finish_reason) finish[c.index] = c.finish_reason;
        }
    }
    ok(texts.every((t, i) => t === r.choices[i].message.content), 'streamed choices equal the non-streamed ones (same seed)');
    ok(finish.every((f) => f === 'stop' || f === 'length'), 'every streamed choice finishes');
    ok(usage && usage.completion_tokens === r.usage.completion_tokens, 'streamed usage of all choices');
    const g = await client.completions.create({ model, prompt: ['Once upon a time', 'The dog'], max_tokens: 6, temperature: 0, n: 2 });
    ok(g.choices.length === 4 && g.choices[0].text === g.choices[1].text && g.choices[2].text === g.choices[3].text, 'completions: two prompts times n=2');
    const ev = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 0, echo: true, logprobs: 1 });
    const lp = ev.choices[0].logprobs;
    ok(ev.choices[0].text === 'Once upon a time' && lp.token_logprobs.length === ev.usage.prompt_tokens && lp.token_logprobs[0] === null, 'echo + logprobs with max_tokens 0: the prompt\'s log-probabilities');
    const one = await client.completions.create({ model, prompt: 'The dog', max_tokens: 6, temperature: 0 });
    ok(g.choices[2].text === one.choices[0].text, 'the second prompt\'s choices are its own');
    const bad = await status(client.chat.completions.create({ ...req, n: 65 }));
    ok(bad.status === 400 && bad.err.param === 'n', 'n over the limit 400');
}

async function embeddings(model) {
    const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
    const b = await client.embeddings.create({ model, input: ['a cat', 'a dog'] });
    ok(b.data.length === 2 && b.data[1].index === 1, 'two embeddings');
    ok(b.data.every((d) => d.embedding.length === 64 && Math.abs(norm(d.embedding) - 1) < 1e-3), 'unit vectors of n_embd');
    const f = await client.embeddings.create({ model, input: 'a cat', encoding_format: 'float' });
    ok(f.data[0].embedding.every((x, i) => Math.abs(x - b.data[0].embedding[i]) < 1e-5), 'float equals base64');
    ok(f.usage.prompt_tokens > 0, 'embedding usage');
    const ids = await client.embeddings.create({ model, input: [[1, 400, 23], [1, 9]], encoding_format: 'float' });
    ok(ids.data.length === 2 && ids.usage.prompt_tokens === 5, 'embeddings of token ids');
}

// the Responses API: the same greedy text as chat for the same messages,
// streamed events in order, text.format json_object, function tools (the
// prompt as chat renders it, a call as a function_call item, the follow-up
// turn), refusals
async function responses(model) {
    const input = [{ role: 'user', content: 'Tell me a story' }];
    const ref = await client.chat.completions.create({ model, messages: input, max_tokens: 12, temperature: 0 });
    const r = await client.responses.create({ model, input, max_output_tokens: 12, temperature: 0 });
    ok(r.object === 'response' && r.id.startsWith('resp_'), 'responses: a response object');
    ok(r.output_text === ref.choices[0].message.content, `responses: the chat reply's text (${JSON.stringify(r.output_text)})`);
    ok(r.status === 'incomplete' && r.incomplete_details?.reason === 'max_output_tokens', `responses: cut by max_output_tokens (${r.status})`);
    ok(r.usage.output_tokens === 12 && r.usage.input_tokens === ref.usage.prompt_tokens &&
       r.usage.total_tokens === r.usage.input_tokens + 12, 'responses: usage');
    const stream = await client.responses.create({ model, input, max_output_tokens: 12, temperature: 0, stream: true });
    const types = [];
    let text = '', last = null;
    for await (const ev of stream) {
        types.push(ev.type);
        if (ev.type === 'response.output_text.delta') text += ev.delta;
        last = ev;
    }
    ok(text === r.output_text, `responses stream: the deltas make the text (${JSON.stringify(text)})`);
    ok(types[0] === 'response.created' && types.includes('response.output_item.added') &&
       types.includes('response.output_text.done') && last.type === 'response.incomplete' &&
       last.response.output[0].content[0].text === text, `responses stream: the events (${[...new Set(types)]})`);
    const j = await client.responses.create({ model, input: 'x', instructions: 'Answer in JSON', max_output_tokens: 40,
        text: { format: { type: 'json_object' } } });
    ok(j.output_text.trimStart().startsWith('{'), `responses json_object: an object begins (${JSON.stringify(j.output_text)})`);
    // function tools: the prompt as chat completions renders it with the same tools
    const rtools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
    const ctools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
        parameters: rtools[0].parameters } }];
    const cref = await client.chat.completions.create({ model, messages: input, tools: ctools, max_tokens: 8, temperature: 0 });
    const rt = await client.responses.create({ model, input, tools: rtools, max_output_tokens: 8, temperature: 0 });
    ok(rt.usage.input_tokens === cref.usage.prompt_tokens && rt.output_text === (cref.choices[0].message.content ?? ''),
       `responses tools: rendered as chat's (${rt.usage.input_tokens} vs ${cref.usage.prompt_tokens})`);
    // a reply held to a call's JSON shape comes back as a function_call item
    const callSchema = { type: 'object', properties: { name: { const: 'get_weather' },
        arguments: { type: 'object', properties: { city: { enum: ['Paris'] } }, required: ['city'] } }, required: ['name', 'arguments'] };
    const rc = await client.responses.create({ model, input: 'weather?', tools: rtools, max_output_tokens: 250,
        text: { format: { type: 'json_schema', name: 'call', schema: callSchema } } });
    const fc = rc.output.find((o) => o.type === 'function_call');
    ok(fc && fc.name === 'get_weather' && JSON.parse(fc.arguments).city === 'Paris' && fc.call_id.startsWith('call_'),
       `responses: a call in the reply is a function_call item (${JSON.stringify(rc.output)})`);
    // the follow-up turn: the call and its output as input items, rendered as chat's tool messages
    const follow = [...input, { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
        { type: 'function_call_output', call_id: 'call_1', output: 'sunny' }];
    const cmsgs = [...input, { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] }, { role: 'tool', tool_call_id: 'call_1', content: 'sunny' }];
    const cf = await client.chat.completions.create({ model, messages: cmsgs, tools: ctools, max_tokens: 4, temperature: 0 });
    const rf = await client.responses.create({ model, input: follow, tools: rtools, max_output_tokens: 4, temperature: 0 });
    ok(rf.usage.input_tokens === cf.usage.prompt_tokens && rf.output_text === (cf.choices[0].message.content ?? ''),
       `responses: function_call and its output rendered as chat's tool turn (${rf.usage.input_tokens} vs ${cf.usage.prompt_tokens})`);
    let e = await status(client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }));
    ok(e.status === 400 && e.err.param === 'tools', 'responses: a non-function tool refused naming it');
    // a forced call: tool_choice naming the function
    const etools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object',
        properties: { city: { enum: ['Paris', 'Rome'] } }, required: ['city'] } }];
    const rq = await client.responses.create({ model, input: 'weather?', tools: etools, max_output_tokens: 250,
        tool_choice: { type: 'function', name: 'get_weather' } });
    const fq = rq.output.find((o) => o.type === 'function_call');
    ok(fq && fq.name === 'get_weather' && ['Paris', 'Rome'].includes(JSON.parse(fq.arguments).city),
       `responses: tool_choice naming a function forces its call (${JSON.stringify(rq.output)})`);
    e = await status(client.responses.create({ model, input: 'x', tool_choice: 'required' }));
    ok(e.status === 400 && e.err.param === 'tool_choice', 'responses: tool_choice required without tools refused');
    // stored responses: retrieve, continue with previous_response_id, delete
    const got = await client.responses.retrieve(r.id);
    ok(got.id === r.id && got.output_text === r.output_text && got.store === true, 'responses: a stored response retrieved');
    const next = await client.responses.create({ model, input: 'and then', previous_response_id: r.id,
        max_output_tokens: 4, temperature: 0 });
    const cn = await client.chat.completions.create({ model, max_tokens: 4, temperature: 0, messages: [...input,
        { role: 'assistant', content: r.output_text }, { role: 'user', content: 'and then' }] });
    ok(next.previous_response_id === r.id && next.usage.input_tokens === cn.usage.prompt_tokens &&
       next.output_text === cn.choices[0].message.content,
       `responses: previous_response_id continues the stored conversation (${next.usage.input_tokens} vs ${cn.usage.prompt_tokens})`);
    const del = await (client.responses.delete ?? client.responses.del).call(client.responses, r.id);
    ok(del === undefined || del === null || del.deleted === true || typeof del === 'object', 'responses: delete');
    e = await status(client.responses.retrieve(r.id));
    ok(e.status === 404, `responses: a deleted response is gone (${e.status})`);
    e = await status(client.responses.create({ model, input: 'x', previous_response_id: r.id }));
    ok(e.status === 400 && e.err.param === 'previous_response_id', 'responses: previous_response_id of a deleted response refused');
    const nostore = await client.responses.create({ model, input: 'x', max_output_tokens: 2, store: false });
    e = await status(client.responses.retrieve(nostore.id));
    ok(nostore.store === false && e.status === 404, 'responses: store false keeps nothing');
}

async function errors(model) {
    const msg = [{ role: 'user', content: 'x' }];
    let r = await status(client.chat.completions.create({ model: 'nope', messages: msg }));
    ok(r.status === 404 && r.err instanceof OpenAI.NotFoundError, `unknown model 404 (${r.status})`);
    r = await status(client.chat.completions.create({ model, messages: 'x' }));
    ok(r.status === 400 && r.err instanceof OpenAI.BadRequestError && /messages/.test(r.err.message), 'messages of the wrong type 400');
    r = await status(client.chat.completions.create({ model, messages: msg, temperature: 'hot' }));
    ok(r.status === 400 && r.err.param === 'temperature', 'wrong type names the field');
    r = await status(client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x'.repeat(1100000) }] }));
    ok(r.status === 413, `body too large 413 (${r.status})`);
    r = await status(client.chat.completions.create({ model, messages: msg, max_tokens: 100000 }));
    ok(r.status === 400 && r.err.code === 'context_length_exceeded', 'context exceeded 400');
    const bad = new OpenAI({ baseURL: `${BASE}/v1`, apiKey: 'wrong', maxRetries: 0 });
    r = await status(bad.models.list());
    ok(r.status === 401 && r.err instanceof OpenAI.AuthenticationError, `wrong key 401 (${r.status})`);
}

try {
    const model = await models();
    await chat(model);
    await completions(model);
    await choices(model);
    await embeddings(model);
    await responses(model);
    await errors(model);
} catch (e) {
    failures.push(`exception: ${e.stack ?? e}`);
}
for (const f of failures) console.log(`  not ok: ${f}`);
console.log(`openai.mjs: ${pass} passed, ${failures.length} failed`);
process.exit(failures.length ? 1 : 0);
