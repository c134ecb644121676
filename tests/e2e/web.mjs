// web.mjs - the built-in web page (GET /) in a real browser (Debian's
// chromium driven by playwright-core): the page loads without script
// errors, names the model, streams a chat reply into the log with its
// stats line, sends the API key it is given, offers the model and its LoRA
// adapter (a greedy reply with the adapter differs), and the dashboard
// fills from /stats.
//
// env: BASE (http://127.0.0.1:PORT), API_KEY (the server's key), CHROMIUM (the browser)
import { chromium } from 'playwright-core';

const BASE = process.env.BASE;
let pass = 0;
const failures = [];
const ok = (cond, what) => (cond ? pass++ : failures.push(what));

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ['--no-sandbox'] });
try {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(BASE + '/');
    await page.fill('#key', process.env.API_KEY);
    await page.dispatchEvent('#key', 'change');
    await page.waitForFunction(() => document.getElementById('model').textContent.length > 0, null, { timeout: 10000 });
    ok((await page.textContent('#model')) === 'stories260K', 'the header names the model');
    ok((await page.textContent('#status')) === 'ok', 'the header shows the health status');

    await page.fill('#temp', '0');
    await page.fill('#maxtok', '12');
    await page.fill('#input', 'Tell me a story');
    await page.click('#send');
    await page.waitForFunction(() => /tokens\/s/.test(document.getElementById('last').textContent), null, { timeout: 20000 });
    const msgs = await page.$$eval('.msg span', (e) => e.map((x) => x.textContent));
    ok(msgs.length === 2 && msgs[0] === 'Tell me a story', `user message shown: ${JSON.stringify(msgs)}`);
    ok(msgs[1] && msgs[1].length > 0 && !msgs[1].includes('['), `streamed reply shown: ${JSON.stringify(msgs[1])}`);
    ok(/12 generated/.test(await page.textContent('#last')), 'stats line counts the generated tokens');

    // the model and adapter choices: one model, its adapter offered; the
    // same greedy request with the adapter gives another reply
    const models = await page.$$eval('#msel option', (e) => e.map((x) => x.value));
    ok(JSON.stringify(models) === '["stories260K"]', `model choices: ${JSON.stringify(models)}`);
    const ads = await page.$$eval('#lsel option', (e) => e.map((x) => x.textContent));
    ok(await page.isVisible('#lsel') && ads.length === 3 && /\(0\)$/.test(ads[2]), `adapter choices: ${JSON.stringify(ads)}`);
    await page.click('#clear');
    await page.selectOption('#lsel', '0');
    await page.fill('#input', 'Tell me a story');
    await page.click('#send');
    await page.waitForFunction(() => /tokens\/s/.test(document.getElementById('last').textContent), null, { timeout: 20000 });
    const withAd = await page.$$eval('.msg span', (e) => e.map((x) => x.textContent));
    ok(withAd.length === 2 && withAd[1].length > 0 && withAd[1] !== msgs[1],
       `the adapter changes the reply: ${JSON.stringify([msgs[1], withAd[1]])}`);

    await page.click('#tab-dash');
    await page.waitForFunction(() => document.querySelectorAll('#dtable tr').length > 5, null, { timeout: 5000 });
    const dash = await page.textContent('#dtable');
    ok(/KV blocks/.test(dash) && /ready/.test(dash), 'dashboard rows from /stats');
    ok(errors.length === 0, `no script errors: ${errors}`);
} finally {
    await browser.close();
}
console.log(`web.mjs: ${pass} passed, ${failures.length} failed`);
for (const f of failures) console.log('  not ok: ' + f);
process.exit(failures.length ? 1 : 0);
