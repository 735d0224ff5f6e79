// A minimal Probot app doing, for `issues.opened` in a vault, the forge work vaultmail does:
// read the office config (`{org}/.github/vaultmail.yml`, kept 60 s like vaultmail's
// OfficeSource), and if the repository is an agent's vault, PATCH the issue once with a marked
// body and the `mail:new` label. Used by bench/probot_compare.py (DESIGN §6).
//
// Configured by env: APP_ID, PRIVATE_KEY_PATH, WEBHOOK_SECRET, PORT, HOST (default 127.0.0.1),
// FORGE_URL (the REST base URL, given in code: GHE_HOST would add /api/v3), LOG_LEVEL (default
// warn) and PROBOT_THROTTLE: "on" keeps Probot's default @octokit/plugin-throttling (writes at
// most one a second, ten requests in flight); anything else turns it off.
import { readFileSync } from "node:fs";
import { pino } from "pino";
import { Probot, ProbotOctokit, Server } from "probot";
import { parse } from "yaml";

const CONFIG_REPO = ".github";
const CONFIG_PATH = "vaultmail.yml";
const MAX_AGE_MS = 60_000;
const ITEM_LABELS = new Set(["goal", "outcome", "plan", "evidence"]);

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is required`);
  return value;
}

const throttled = process.env.PROBOT_THROTTLE === "on";

// Probot merges its own throttle options over any given through Octokit.defaults, so the
// switch has to be applied last, in the constructor.
class Octokit extends ProbotOctokit {
  constructor(options = {}) {
    super(throttled ? options : { ...options, throttle: { ...options.throttle, enabled: false } });
  }
}

// org (lower case) -> { at, office }: one fetch at a time per org, so handlers running
// concurrently share it (vaultmail's worker handles one delivery at a time, so it asks once).
const offices = new Map();

async function fetchOffice(context, org) {
  try {
    const { data } = await context.octokit.rest.repos.getContent({
      owner: org, repo: CONFIG_REPO, path: CONFIG_PATH,
    });
    return parse(Buffer.from(data.content, "base64").toString("utf8"));
  } catch (error) {
    if (error.status !== 404) throw error;
    return null;
  }
}

function officeFor(context, org) {
  const key = org.toLowerCase();
  const cached = offices.get(key);
  if (cached && Date.now() - cached.at < MAX_AGE_MS) return cached.office;
  const office = fetchOffice(context, org);
  offices.set(key, { at: Date.now(), office });
  office.catch(() => offices.delete(key));
  return office;
}

function isVault(office, fullName) {
  const pattern = office.vault_pattern || "{slug}-vault";
  return (office.agents || []).some((agent) => {
    const vault = agent.vault || `${office.org}/${pattern.replace("{slug}", agent.slug)}`;
    return vault.toLowerCase() === fullName.toLowerCase();
  });
}

function app(probot) {
  probot.on("issues.opened", async (context) => {
    const { repository, issue } = context.payload;
    const office = await officeFor(context, repository.owner.login);
    if (!office || !isVault(office, repository.full_name)) return;
    const labels = issue.labels.map((label) => label.name);
    if (labels.some((name) => ITEM_LABELS.has(name.toLowerCase()))) return;
    const kept = labels.filter((name) => !name.toLowerCase().startsWith("mail:"));
    await context.octokit.rest.issues.update(context.issue({
      body: `<!-- probot-bench: from ${context.payload.sender.login} -->\n\n${issue.body || ""}\n`,
      labels: [...kept, "mail:new"],
    }));
  });
}

// `probot run` builds its logger from LOG_LEVEL the same way (JSON lines, as in production).
const log = pino({ name: "probot", level: process.env.LOG_LEVEL || "warn" });
const server = new Server({
  log,
  host: process.env.HOST || "127.0.0.1",
  port: Number.parseInt(need("PORT"), 10),
  Probot: Probot.defaults({
    appId: need("APP_ID"),
    privateKey: readFileSync(need("PRIVATE_KEY_PATH"), "utf8"),
    secret: need("WEBHOOK_SECRET"),
    baseUrl: need("FORGE_URL"),
    log,
    Octokit,
  }),
});
await server.load(app);
await server.start();
