// wsclient.mjs - a small promise wrapper around npm `ws` for the e2e tests:
// every JSON message is queued; next(pred) waits for the first matching one.
import WebSocket from 'ws';

export class Client {
    static open(url, opts = {}) {
        return new Promise((resolve, reject) => {
            const c = new Client(url, opts);
            c.ws.once('open', () => resolve(c));
            c.ws.once('error', reject);
            c.ws.once('unexpected-response', (req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
        });
    }

    constructor(url, opts) {
        this.ws = new WebSocket(url, opts);
        this.queue = [];
        this.waiters = [];
        this.closed = null; // {code, reason} once closed
        this.ws.on('message', (data, isBinary) => {
            let m;
            try {
                m = JSON.parse(data.toString());
            } catch {
                m = { __unparsable: data.toString(), isBinary };
            }
            this.queue.push(m);
            this.wake();
        });
        this.ws.on('close', (code, reason) => {
            this.closed = { code, reason: reason.toString() };
            this.wake();
        });
        this.ws.on('error', () => {});
    }

    wake() {
        const w = this.waiters;
        this.waiters = [];
        w.forEach((f) => f());
    }

    send(obj) {
        this.ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj));
    }

    // Next message matching pred (removed from the queue); rejects on timeout/close.
    next(pred = () => true, ms = 10000) {
        return new Promise((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error('timeout waiting for a message')), ms);
            const look = () => {
                const i = this.queue.findIndex(pred);
                if (i >= 0) {
                    clearTimeout(timer);
                    resolve(this.queue.splice(i, 1)[0]);
                } else if (this.closed) {
                    clearTimeout(timer);
                    reject(new Error(`closed (${this.closed.code}) while waiting`));
                } else this.waiters.push(look);
            };
            look();
        });
    }

    // Collects messages until one satisfies done(); returns them all.
    async until(done, ms = 20000) {
        const out = [];
        const end = Date.now() + ms;
        for (;;) {
            const m = await this.next(() => true, Math.max(1, end - Date.now()));
            out.push(m);
            if (done(m)) return out;
        }
    }

    waitClose(ms = 5000) {
        return new Promise((resolve) => {
            if (this.closed) return resolve(this.closed);
            const t = setTimeout(() => resolve(null), ms);
            this.ws.once('close', (code) => {
                clearTimeout(t);
                resolve({ code });
            });
        });
    }

    close() {
        try {
            this.ws.close();
        } catch {}
    }
}

export function checker(name) {
    let pass = 0;
    const failures = [];
    return {
        ok(cond, what) {
            if (cond) pass++;
            else failures.push(what);
        },
        fail(what) {
            failures.push(what);
        },
        done() {
            for (const f of failures) console.log(`  not ok: ${f}`);
            console.log(`${name}: ${pass} passed, ${failures.length} failed`);
            process.exit(failures.length ? 1 : 0);
        },
    };
}
