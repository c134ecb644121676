// ws.mjs - both WebSocket dialects with npm `ws`: hello, op infer/abort/
// metrics/ping, type generate/abort/ping/load_adapter, one generation per
// session, malformed messages, the message size limit, and admission
// (path, API key by header and by ?api_key=).
//
// env: PORT, API_KEY (the server's key), MAX_FRAME (the server's limit),
// FAKE_GPU=1 when the server runs on the fake NVML of tests/unit
import { Client, checker } from './wsclient.mjs';

const PORT = process.env.PORT;
const KEY = process.env.API_KEY;
const URL = `ws://127.0.0.1:${PORT}/ws?api_key=${KEY}`;
const t = checker('ws.mjs');
const isEnd = (m) => m.op === 'end' || m.op === 'error';
const isDone = (m) => m.type === 'done' || m.type === 'error';

async function opDialect() {
    const c = await Client.open(URL);
    const hello = await c.next((m) => m.op === 'hello');
    t.ok(hello.status === 'ready' && hello.model === 'stories260K', `hello ${JSON.stringify(hello)}`);

    c.send({ op: 'infer', prompt: 'Once upon a time', params: { temp: 0, max_tokens: 12, raw: true } });
    const msgs = await c.until(isEnd);
    const toks = msgs.filter((m) => m.op === 'token');
    const end = msgs[msgs.length - 1];
    t.ok(end.op === 'end', `op end: ${JSON.stringify(end)}`);
    t.ok(toks.length > 0 && toks.every((m) => typeof m.content === 'string'), 'op tokens');
    t.ok(toks.every((m) => m.prob === undefined || (m.prob >= 0 && m.prob <= 1)), 'op token prob in [0,1]');
    t.ok(toks.map((m) => m.content).join('').startsWith(', there was a little girl'), 'op greedy text');
    const s = end.stats ?? {};
    t.ok(['ttft_ms', 'total_ms', 'tokens', 'tps'].every((k) => typeof s[k] === 'number'), `op stats ${JSON.stringify(s)}`);
    t.ok(s.tokens === 12 && end.finish_reason === 'length', 'op stats tokens = max_tokens');

    // abort mid-stream
    c.send({ op: 'infer', prompt: 'Once upon a time', params: { temp: 0.8, max_tokens: 400, raw: true } });
    await c.next((m) => m.op === 'token');
    c.send({ op: 'infer', prompt: 'again' });
    const busy = await c.next((m) => m.op === 'error');
    t.ok(/already running/.test(busy.message), 'one generation per connection');
    c.send({ op: 'abort' });
    const aborted = await c.next(isEnd);
    t.ok(aborted.op === 'end' && aborted.finish_reason === 'abort' && aborted.stats.tokens < 400, `op abort: ${JSON.stringify(aborted)}`);
    c.queue.length = 0;

    c.send({ op: 'ping' });
    t.ok((await c.next((m) => m.op === 'pong')).op === 'pong', 'op pong');
    c.ws.send('{"op":', { fin: false }); // one message in three frames
    c.ws.send('"pi', { fin: false });
    c.ws.send('ng"}', { fin: true });
    t.ok((await c.next((m) => m.op === 'pong')).op === 'pong', 'fragmented message reassembled');
    const pong = new Promise((resolve) => c.ws.once('pong', (d) => resolve(d.toString())));
    c.ws.ping('hb');
    t.ok((await pong) === 'hb', 'protocol-level ping answered with pong');

    c.send({ op: 'metrics' });
    const m1 = await c.next((m) => m.op === 'metrics');
    const m2 = await c.next((m) => m.op === 'metrics', 3000);
    t.ok(m1.inference && typeof m1.inference.total_tokens === 'number' && 'gpu' in m1, 'metrics message');
    t.ok(m2.op === 'metrics', 'metrics broadcast every second');
    if (process.env.FAKE_GPU === '1') // the fake NVML of tests/unit: 50 C, 8 GiB
        t.ok(m2.gpu.available && m2.gpu.gpus[0].temp_c === 50 && m2.gpu.gpus[0].vram_total_bytes === 8 * 2 ** 30,
            `GPU in the metrics: ${JSON.stringify(m2.gpu).slice(0, 200)}`);
    c.send({ op: 'metrics', subscribe: false });

    // malformed input: an error each, the connection stays usable
    const errs = [
        ['{"op":"infer",', /invalid JSON at line 1, column/],
        ['[1,2]', /JSON object/],
        ['{"hello":1}', /"op" or a "type"/],
        [{ op: 'fly' }, /unknown op/],
        [{ op: 42 }, /'op' must be a string/],
        [{ op: 'infer' }, /prompt/],
        [{ op: 'infer', prompt: 'x', params: { temp: 'hot' } }, /'temp' must be a number/],
        [{ op: 'infer', prompt: 'x', params: { max_tokens: 100000 } }, /max_tokens/],
    ];
    for (const [msg, re] of errs) {
        c.send(msg);
        const e = await c.next((m) => m.op === 'error');
        t.ok(re.test(e.message), `error for ${JSON.stringify(msg)}: ${e.message}`);
    }
    c.ws.send(Buffer.from([1, 2, 3]), { binary: true });
    t.ok(/binary/.test((await c.next((m) => m.op === 'error')).message), 'binary message refused');
    c.send({ op: 'ping' });
    t.ok((await c.next((m) => m.op === 'pong')).op === 'pong', 'still usable after errors');
    c.close();
}

async function typeDialect() {
    const c = await Client.open(URL);
    await c.next((m) => m.op === 'hello');
    const gen = (sid, extra = {}) => ({
        type: 'generate', session_id: sid, messages: [{ role: 'user', content: 'Tell me a story' }],
        max_tokens: 10, temperature: 0, top_k: 50, top_p: 0.9, ...extra,
    });
    c.send(gen('s1', { system_prompt: 'You are a storyteller.' }));
    const msgs = await c.until((m) => isDone(m) && m.session_id === 's1');
    const done = msgs[msgs.length - 1];
    const toks = msgs.filter((m) => m.type === 'token');
    t.ok(done.type === 'done', `type done: ${JSON.stringify(done)}`);
    t.ok(toks.every((m) => m.session_id === 's1'), 'tokens carry the session_id');
    t.ok(done.content === toks.map((m) => m.content).join(''), 'done has the full text');

    // two sessions at once, the same session twice
    c.send(gen('a', { max_tokens: 30, temperature: 0.7 }));
    c.send(gen('b', { max_tokens: 30, temperature: 0.7 }));
    c.send(gen('a'));
    const busy = await c.next((m) => m.type === 'error' && m.session_id === 'a');
    t.ok(/already has a generation/.test(busy.message), 'one generation per session_id');
    const da = await c.next((m) => m.type === 'done' && m.session_id === 'a');
    const db = await c.next((m) => m.type === 'done' && m.session_id === 'b');
    t.ok(da.content.length > 0 && db.content.length > 0, 'two sessions in parallel');

    // abort
    c.queue.length = 0;
    c.send(gen('long', { max_tokens: 400, temperature: 0.8 }));
    await c.next((m) => m.type === 'token' && m.session_id === 'long');
    c.send({ type: 'abort', session_id: 'long' });
    const ab = await c.next((m) => isDone(m) && m.session_id === 'long');
    t.ok(ab.type === 'done' && ab.finish_reason === 'abort', `type abort: ${JSON.stringify(ab).slice(0, 200)}`);

    c.send({ type: 'ping', timestamp: 123 });
    const pong = await c.next((m) => m.type === 'pong');
    t.ok(pong.timestamp === 123, 'type pong echoes the timestamp');
    c.send({ type: 'load_adapter', adapter_path: '/x/adapter.gguf', session_id: 's1' });
    const la = await c.next((m) => m.type === 'error');
    t.ok(/--lora-dir/.test(la.message) && la.session_id === 's1',
         `load_adapter without --lora-dir refused: ${la.message}`);
    c.send({ type: 'generate', session_id: 's9', messages: [{ role: 'user', content: 'x' }], max_tokens: 'ten' });
    const wt = await c.next((m) => m.type === 'error');
    t.ok(/'max_tokens' must be an integer/.test(wt.message) && wt.session_id === 's9', `wrong type: ${wt.message}`);
    c.send({ type: 'generate', session_id: 's9', messages: 'hi' });
    t.ok(/messages/.test((await c.next((m) => m.type === 'error')).message), 'messages must be an array');
    c.send('{"type":"generate", nope}');
    t.ok(/invalid JSON/.test((await c.next((m) => m.type === 'error')).message), 'bad JSON in type dialect');
    c.close();
}

async function limits() {
    const c = await Client.open(URL);
    await c.next((m) => m.op === 'hello');
    c.send({ op: 'ping', pad: 'x'.repeat(Number(process.env.MAX_FRAME) + 10) });
    const e = await c.next((m) => m.op === 'error' || m.type === 'error');
    t.ok(/over the limit/.test(e.message), 'oversized message refused');
    const cl = await c.waitClose();
    t.ok(cl && cl.code === 1009, `closed with 1009 (${cl && cl.code})`);
}

async function admission() {
    const refused = async (url, opts) => {
        try {
            const c = await Client.open(url, opts);
            c.close();
            return 'opened';
        } catch (e) {
            return e.message;
        }
    };
    t.ok((await refused(`ws://127.0.0.1:${PORT}/ws`)) === 'HTTP 401', 'no key: 401');
    t.ok((await refused(`ws://127.0.0.1:${PORT}/ws?api_key=bad`)) === 'HTTP 401', 'bad key: 401');
    t.ok((await refused(`ws://127.0.0.1:${PORT}/other?api_key=${KEY}`)) === 'HTTP 404', 'wrong path: 404');
    t.ok((await refused(`ws://127.0.0.1:${PORT}/ws`, { headers: { Authorization: `Bearer ${KEY}` } })) === 'opened', 'key in the header');
}

for (const [name, f] of [['op', opDialect], ['type', typeDialect], ['limits', limits], ['admission', admission]]) {
    try {
        await f();
    } catch (e) {
        t.fail(`${name}: exception ${e.stack ?? e}`);
    }
}
t.done();
