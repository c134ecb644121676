// storm.mjs - 64 WebSocket clients at once on stories260K, a third of them
// misbehaving: aborting mid-stream, vanishing mid-stream, sending bad JSON
// and wrong types, or sending malformed frames on a raw socket. Every
// well-formed request must get its complete stream; afterwards the server
// must be up with its KV blocks back to the idle level and no live
// requests. Two rounds: memory after the second must not have grown.
//
// env: PORT, PID (the server's, for /proc/PID/status), RSS_CHECK (0: skip the
// memory comparison, e.g. under AddressSanitizer)
import fs from 'node:fs';
import net from 'node:net';
import { Client, checker } from './wsclient.mjs';

const PORT = process.env.PORT;
const URL = `ws://127.0.0.1:${PORT}/ws`;
const HTTP = `http://127.0.0.1:${PORT}`;
const t = checker('storm.mjs');
const isTerminal = (m) => m.op === 'end' || m.type === 'done' || m.op === 'error' || m.type === 'error';

const rssKiB = () => {
    const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${process.env.PID}/status`, 'utf8'));
    return m ? Number(m[1]) : 0;
};
const stats = async () => (await fetch(`${HTTP}/stats`)).json();

function request(i, maxTokens) {
    if (i % 2)
        return { op: 'infer', prompt: `Once upon a time ${i}`, params: { temp: 0.8, max_tokens: maxTokens, raw: true } };
    return { type: 'generate', session_id: `s${i}`, messages: [{ role: 'user', content: `Story ${i}` }], max_tokens: maxTokens, temperature: 0.8 };
}

// A complete stream: tokens, then end/done with a normal finish; for the
// type dialect the full text must equal the concatenated tokens.
function checkStream(i, msgs, what) {
    const last = msgs[msgs.length - 1];
    const text = msgs.filter((m) => m.op === 'token' || m.type === 'token').map((m) => m.content).join('');
    if (!(last.op === 'end' || last.type === 'done')) return t.fail(`${what} ${i}: ended with ${JSON.stringify(last)}`);
    t.ok(['stop', 'length'].includes(last.finish_reason), `${what} ${i}: finish ${last.finish_reason}`);
    if (last.type === 'done') t.ok(last.content === text, `${what} ${i}: done.content is the whole stream`);
    else t.ok(last.stats.tokens >= msgs.filter((m) => m.op === 'token').length, `${what} ${i}: stats.tokens`);
}

async function good(i) {
    const c = await Client.open(URL);
    for (let r = 0; r < 2; r++) {
        c.send(request(i, 8 + (i % 4) * 4));
        checkStream(i, await c.until(isTerminal, 60000), 'good');
    }
    c.close();
}

async function aborter(i) {
    const c = await Client.open(URL);
    c.send(request(i, 300));
    await c.next((m) => m.op === 'token' || m.type === 'token', 30000);
    c.send(i % 2 ? { op: 'abort' } : { type: 'abort', session_id: `s${i}` });
    const msgs = await c.until(isTerminal, 30000);
    const last = msgs[msgs.length - 1];
    t.ok((last.op === 'end' || last.type === 'done') && ['abort', 'stop', 'length'].includes(last.finish_reason),
        `aborter ${i}: ${JSON.stringify(last).slice(0, 120)}`);
    c.close();
}

async function vanisher(i) {
    const c = await Client.open(URL);
    c.send(request(i, 300));
    await c.next((m) => m.op === 'token' || m.type === 'token', 30000);
    c.ws.terminate(); // no close frame: the TCP connection just goes
}

async function badJson(i) {
    const c = await Client.open(URL);
    const junk = ['{"op":"infer","prompt":', 'null', '{"type":"generate","messages":7}', '{"op":"infer","prompt":"x","params":{"max_tokens":"many"}}', '\u0000\u0001'];
    for (const j of junk) {
        c.send(j);
        await c.next((m) => m.op === 'error' || m.type === 'error', 10000);
    }
    c.send(request(i, 24)); // then a well-formed one: it must complete
    checkStream(i, await c.until((m) => isTerminal(m), 60000), 'after-junk');
    c.close();
}

const badFrames = [
    Buffer.from([0x81, 0x05, 0x68, 0x65, 0x6c, 0x6c, 0x6f]), // unmasked text frame
    Buffer.from([0x83, 0x80, 1, 2, 3, 4]), // reserved opcode 3
    Buffer.from([0x81, 0x82, 0, 0, 0, 0, 0xff, 0xfe]), // text that is not UTF-8
    Buffer.from([0x81, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4]), // 2^64-1 bytes
    Buffer.from([0x89, 0xfe, 0x01, 0x00, 1, 2, 3, 4]), // ping over 125 bytes
];

function rawFrames(i) {
    return new Promise((resolve) => {
        const s = net.connect(PORT, '127.0.0.1');
        let upgraded = false;
        const done = (how) => {
            s.destroy();
            resolve(how);
        };
        const timer = setTimeout(() => done('timeout'), 8000);
        s.on('data', (d) => {
            if (!upgraded && d.toString().startsWith('HTTP/1.1 101')) {
                upgraded = true;
                s.write(badFrames[i % badFrames.length]);
            } else if (upgraded && d.includes('"error"')) {
                clearTimeout(timer); // lws reads unmasked frames leniently: an error reply is fine too
                done('answered');
            }
        });
        s.on('close', () => {
            clearTimeout(timer);
            done(upgraded ? 'closed' : 'refused');
        });
        s.on('error', () => {});
        s.write(`GET /ws HTTP/1.1\r\nHost: 127.0.0.1:${PORT}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
            'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n');
    });
}

async function round(n) {
    const roles = [];
    for (let i = 0; i < 64; i++) roles.push(i < 40 ? good : i < 48 ? aborter : i < 54 ? vanisher : i < 59 ? badJson : null);
    const jobs = roles.map((f, i) => (f ? f(i) : rawFrames(i).then((how) => t.ok(how === 'closed' || how === 'answered', `raw frames ${i}: ${how}`))));
    const results = await Promise.allSettled(jobs);
    results.forEach((r, i) => r.status === 'rejected' && t.fail(`round ${n} client ${i}: ${r.reason}`));
    let st;
    for (let k = 0; k < 100; k++) { // the vanished clients' aborts are asynchronous
        st = await stats();
        if (st.live_requests === 0 && st.sched.running === 0 && st.sched.queued === 0) break;
        await new Promise((r) => setTimeout(r, 50));
    }
    return st;
}

try {
    const idle = await stats();
    const s1 = await round(1);
    const rss1 = rssKiB();
    const s2 = await round(2);
    const rss2 = rssKiB();
    for (const s of [s1, s2]) {
        t.ok(s.kv.blocks_used === idle.kv.blocks_used, `KV blocks used back to idle: ${s.kv.blocks_used} vs ${idle.kv.blocks_used}`);
        t.ok(s.live_requests === 0 && s.sched.running === 0 && s.sched.queued === 0, `no live requests: ${JSON.stringify(s.sched)}`);
    }
    if (process.env.RSS_CHECK !== '0')
        t.ok(rss2 - rss1 < 8192, `memory stable across rounds: ${rss1} KiB then ${rss2} KiB`);
    const h = await fetch(`${HTTP}/health`);
    t.ok(h.status === 200, 'server still healthy');
    console.log(`storm: rss ${rss1} -> ${rss2} KiB, requests ${JSON.stringify(s2.requests)}`);
} catch (e) {
    t.fail(`exception ${e.stack ?? e}`);
}
t.done();
