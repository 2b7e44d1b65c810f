// report-check.mjs PAGE OUTDIR: opens a report page of replay report in
// headless Chromium through the DevTools protocol (Node's own WebSocket,
// no npm package) at 1280 px wide and fails (exit 1, a line per problem)
// on any console error, uncaught exception or request for anything but the
// page itself; on charts that did not draw (every figure.chart needs a
// canvas of non-zero size); on a page wider than the window (sideways
// scrolling); on a chart whose data disagree with its table (each policy's
// largest reserved bytes in the series against its peak reserved in the
// table); and on a zoom, a double-click, the cursor's values or a table's
// sorting that do not work. It writes a screenshot per section,
// OUTDIR/NN-ID.png, 1280 px wide. Run by .ci/report-check; needs Node 20
// or later and Debian's chromium.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [pagePath, outDir] = process.argv.slice(2);
if (!pagePath || !outDir) {
	console.error("usage: node --experimental-websocket report-check.mjs PAGE OUTDIR");
	process.exit(2);
}
const WIDTH = 1280, HEIGHT = 900;
const problems = [];
const fail = (msg) => problems.push(msg);

const profile = mkdtempSync(join(tmpdir(), "report-check-"));
const browser = spawn("chromium", [
	"--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
	"--remote-debugging-port=0", `--user-data-dir=${profile}`, `--window-size=${WIDTH},${HEIGHT}`, "about:blank",
], { stdio: ["ignore", "ignore", "pipe"] });
let stderr = "";
const wsURL = await new Promise((ok, no) => {
	const t = setTimeout(() => no(new Error("chromium did not start in 30 s:\n" + stderr)), 30000);
	browser.stderr.on("data", (b) => {
		stderr += b;
		const m = /DevTools listening on (ws:\/\/\S+)/.exec(stderr);
		if (m) { clearTimeout(t); ok(m[1]); }
	});
	browser.on("exit", (code) => no(new Error(`chromium exited (${code}):\n${stderr}`)));
});

// A DevTools connection: send(method, params, session) answers with the
// result; on(method, fn) listens to events.
const ws = new WebSocket(wsURL);
await new Promise((ok, no) => { ws.onopen = ok; ws.onerror = () => no(new Error("no DevTools connection")); });
let nextId = 1;
const pending = new Map(), listeners = new Map();
ws.onmessage = (ev) => {
	const msg = JSON.parse(ev.data);
	if (msg.id && pending.has(msg.id)) {
		const { ok, no } = pending.get(msg.id);
		pending.delete(msg.id);
		msg.error ? no(new Error(msg.error.message)) : ok(msg.result);
	} else if (msg.method) {
		(listeners.get(msg.method) || []).forEach((fn) => fn(msg.params));
	}
};
const send = (method, params = {}, sessionId) => new Promise((ok, no) => {
	const id = nextId++;
	pending.set(id, { ok, no });
	ws.send(JSON.stringify({ id, method, params, sessionId }));
});
const on = (method, fn) => listeners.set(method, [...(listeners.get(method) || []), fn]);

async function main() {
	const { targetId } = await send("Target.createTarget", { url: "about:blank" });
	const { sessionId: s } = await send("Target.attachToTarget", { targetId, flatten: true });
	const cdp = (m, p) => send(m, p, s);
	const pageURL = pathToFileURL(resolve(pagePath)).href;
	on("Runtime.consoleAPICalled", (p) => {
		if (p.type === "error" || p.type === "assert" || p.type === "warning")
			fail(`console ${p.type}: ${p.args.map((a) => a.value ?? a.description).join(" ")}`);
	});
	on("Runtime.exceptionThrown", (p) => fail(`uncaught exception: ${p.exceptionDetails.exception?.description ?? p.exceptionDetails.text}`));
	on("Log.entryAdded", (p) => { if (p.entry.level === "error") fail(`log error: ${p.entry.text} ${p.entry.url ?? ""}`); });
	on("Network.requestWillBeSent", (p) => {
		const u = p.request.url;
		if (u !== pageURL && !u.startsWith("data:") && !u.startsWith("about:")) fail(`the page requests ${u}`);
	});
	await cdp("Runtime.enable");
	await cdp("Log.enable");
	await cdp("Network.enable");
	await cdp("Page.enable");
	await cdp("Emulation.setDeviceMetricsOverride", { width: WIDTH, height: HEIGHT, deviceScaleFactor: 1, mobile: false });
	const loaded = new Promise((ok) => on("Page.loadEventFired", ok));
	await cdp("Page.navigate", { url: pageURL });
	await loaded;
	const evaluate = async (expr) => {
		const r = await cdp("Runtime.evaluate", { expression: expr, returnByValue: true, awaitPromise: true });
		if (r.exceptionDetails) throw new Error(`${expr.slice(0, 60)}...: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
		return r.result.value;
	};
	let ready = null;
	for (let i = 0; i < 300 && !ready; i++) {
		ready = await evaluate("window.reportReady || null");
		if (!ready) await new Promise((ok) => setTimeout(ok, 100));
	}
	if (!ready) {
		fail("the page's script did not finish in 30 s (window.reportReady unset)");
		return;
	}
	for (const e of ready.errors) fail(`chart error: ${e}`);

	// Every chart drew a canvas of non-zero size; the page fits the window.
	const layout = await evaluate(`(() => {
		const figs = [...document.querySelectorAll("figure.chart")];
		return {
			figures: figs.length,
			drawn: figs.filter((f) => { const c = f.querySelector("canvas"); return c && c.width > 0 && c.height > 0 && c.getBoundingClientRect().width > 0; }).map((f) => f.id),
			missing: figs.filter((f) => !f.querySelector("canvas")).map((f) => f.id),
			scrollWidth: document.documentElement.scrollWidth,
			wide: [...document.querySelectorAll("body *")].filter((e) => !e.closest(".scroll") && e.getBoundingClientRect().right > ${WIDTH} + 1).map((e) => e.tagName + (e.id ? "#" + e.id : "") + "." + e.className).slice(0, 5),
		};
	})()`);
	if (layout.figures === 0) fail("the page has no charts");
	if (ready.charts !== layout.figures) fail(`${ready.charts} charts drawn of ${layout.figures}`);
	for (const id of layout.missing) fail(`chart ${id} has no canvas`);
	if (layout.drawn.length !== layout.figures) fail(`${layout.drawn.length} of ${layout.figures} charts have a canvas of non-zero size`);
	if (layout.scrollWidth > WIDTH) fail(`the page is ${layout.scrollWidth} px wide at ${WIDTH}: it scrolls sideways (${layout.wide.join(", ")})`);

	// The series agree with the table: a policy's largest reserved bytes
	// over its series are its peak reserved bytes.
	const agree = await evaluate(`(() => {
		const out = [];
		for (const src of document.querySelectorAll('script[type="application/json"]')) {
			const d = JSON.parse(src.textContent).series;
			if (!d) continue;
			const section = src.closest("section"), table = section.querySelector("table.cmp");
			const rows = [...table.tBodies[0].rows];
			// A recording's failed mallocs, served for want of a capacity,
			// count in the peaks for an instant that no series point holds.
			const failed = [...section.querySelectorAll("table.facts tr")].find((r) => r.cells[0].textContent === "mallocs that failed in the recording");
			const served = failed && Number(failed.cells[1].textContent) > 0;
			d.policies.forEach((p, k) => {
				if (p.x < 0) return;
				const peak = Math.max(...window.reportDecode(d.columns[p.reserved]));
				const want = Number(rows[k].cells[2].getAttribute("data-v"));
				if (peak !== want && !(served && peak < want)) out.push(section.id + " " + p.label + ": series peak " + peak + ", table " + want);
			});
			out.push("ok " + section.id);
		}
		return out;
	})()`);
	const checked = agree.filter((l) => l.startsWith("ok ")).length;
	agree.filter((l) => !l.startsWith("ok ")).forEach((l) => fail(`series and table differ: ${l}`));
	if (checked === 0) fail("no section's series checked against its table");

	// Interaction on the first memory chart: the cursor's values, a drag
	// zooms it and its section's fragmentation chart, a double-click zooms
	// out.
	const first = await evaluate(`(() => {
		const f = document.querySelector('figure.chart[data-kind="memory"]');
		if (!f) return null;
		f.scrollIntoView({ block: "center" });
		const r = f.querySelector(".u-over").getBoundingClientRect();
		const c = window.reportCharts.find((c) => c.fig === f);
		return { id: f.id, left: r.left, top: r.top, width: r.width, height: r.height, min: c.u.scales.x.min, max: c.u.scales.x.max };
	})()`);
	if (first) {
		const y = first.top + first.height / 2;
		const at = (f) => first.left + f * first.width;
		const mouse = (type, x, extra = {}) => cdp("Input.dispatchMouseEvent", { type, x, y, button: "left", ...extra });
		await mouse("mouseMoved", at(0.5), { button: "none" });
		const legend = await evaluate(`document.querySelector("#${first.id} .legend .at").textContent`);
		if (!/^at /.test(legend)) fail(`${first.id}: no values under the cursor (legend says "${legend}")`);
		await mouse("mousePressed", at(0.3), { clickCount: 1 });
		await mouse("mouseMoved", at(0.45), { buttons: 1 });
		await mouse("mouseMoved", at(0.6), { buttons: 1 });
		await mouse("mouseReleased", at(0.6), { clickCount: 1 });
		const zoomed = await evaluate(`(() => {
			const f = document.getElementById("${first.id}");
			const g = window.reportCharts.filter((c) => c.fig.getAttribute("data-src") === f.getAttribute("data-src") && c.fig.getAttribute("data-kind") !== "latency");
			return g.map((c) => [c.fig.id, c.u.scales.x.min, c.u.scales.x.max]);
		})()`);
		const span = first.max - first.min;
		for (const [id, min, max] of zoomed) {
			if (!(max - min < 0.5 * span && min > first.min)) fail(`${id}: a drag over 30% of ${first.id} did not zoom it (x ${min}..${max} of ${first.min}..${first.max})`);
		}
		await mouse("mousePressed", at(0.5), { clickCount: 1 });
		await mouse("mouseReleased", at(0.5), { clickCount: 1 });
		await mouse("mousePressed", at(0.5), { clickCount: 2 });
		await mouse("mouseReleased", at(0.5), { clickCount: 2 });
		const reset = await evaluate(`(() => { const c = window.reportCharts.find((c) => c.fig.id === "${first.id}"); return [c.u.scales.x.min, c.u.scales.x.max]; })()`);
		if (Math.abs(reset[0] - first.min) > 1e-9 * span || Math.abs(reset[1] - first.max) > 1e-9 * span) fail(`${first.id}: a double-click did not zoom out (x ${reset[0]}..${reset[1]}, want ${first.min}..${first.max})`);
		await mouse("mouseMoved", 5, { button: "none" });
	}

	// Sorting: a click on the peak reserved header sorts the first table
	// of policies by it, ascending, a second click descending (the page is
	// then loaded again for the screenshots).
	const sorted = await evaluate(`(() => {
		const t = document.querySelector("table.cmp"), th = t.tHead.rows[0].cells[2];
		const vals = () => [...t.tBodies[0].rows].map((r) => Number(r.cells[2].getAttribute("data-v")));
		const before = vals();
		th.click();
		const up = vals();
		th.click();
		const down = vals();
		return { before, up, down, aria: th.getAttribute("aria-sort") };
	})()`);
	const asc = [...sorted.before].sort((a, b) => a - b);
	if (JSON.stringify(sorted.up) !== JSON.stringify(asc)) fail(`sorting by peak reserved: ${sorted.up} not ascending`);
	if (JSON.stringify(sorted.down) !== JSON.stringify([...asc].reverse())) fail(`sorting by peak reserved again: ${sorted.down} not descending`);
	const reloaded = new Promise((ok) => on("Page.loadEventFired", ok));
	await cdp("Page.reload", {});
	await reloaded;
	for (let i = 0; i < 300; i++) {
		if (await evaluate("window.reportReady || null")) break;
		await new Promise((ok) => setTimeout(ok, 100));
	}

	// A screenshot per section: the page's head, the overview, each trace,
	// job and comparison; each chart's cursor at 62% of its width, so that
	// the values under it show in its legend.
	await evaluate(`window.reportCharts.forEach((c) => {
		const r = c.u.over.getBoundingClientRect();
		c.u.setCursor({ left: Math.round(0.62 * r.width), top: Math.round(0.5 * r.height) });
	})`);
	const parts = await evaluate(`(() => {
		const els = [document.querySelector("header"), ...document.querySelectorAll("section")];
		return els.map((e) => { const r = e.getBoundingClientRect(); return { id: e.id || "top", y: r.top + window.scrollY, h: r.height }; });
	})()`);
	let n = 0;
	for (const p of parts) {
		const h = Math.min(Math.ceil(p.h) + 16, 12000);
		const shot = await cdp("Page.captureScreenshot", { format: "png", captureBeyondViewport: true, clip: { x: 0, y: Math.max(p.y - 8, 0), width: WIDTH, height: h, scale: 1 } });
		const file = join(outDir, `${String(++n).padStart(2, "0")}-${p.id}.png`);
		writeFileSync(file, Buffer.from(shot.data, "base64"));
		console.log(`report-check: ${file} (${WIDTH}x${h}, section ${p.id})`);
	}
	console.log(`report-check: ${ready.charts} charts drawn, ${checked} sections' series checked against their tables, page ${layout.scrollWidth} px wide`);
}

let code = 0;
try {
	await main();
} catch (e) {
	fail(String(e.stack || e));
}
if (problems.length > 0) {
	for (const p of problems) console.error(`report-check: ${p}`);
	code = 1;
}
ws.close();
browser.kill();
await new Promise((ok) => { browser.once("exit", ok); setTimeout(ok, 3000); });
rmSync(profile, { recursive: true, force: true });
process.exit(code);
