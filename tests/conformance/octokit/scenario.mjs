// Octokit, unmodified (@octokit/rest with the throttling and retry plugins, @octokit/auth-app),
// driven against the local forge by tests/conformance/test_clients_octokit.py, which checks the
// JSON this prints. Input in the environment: FORGE_URL, APP_ID, PRIVATE_KEY_PATH, OWNER, REPO,
// FAULTS_URL (the forge's /_forge/faults control, to inject one refusal at a time).
import { readFileSync } from "node:fs";
import { Octokit } from "@octokit/rest";
import { throttling } from "@octokit/plugin-throttling";
import { retry } from "@octokit/plugin-retry";
import { createAppAuth } from "@octokit/auth-app";

const env = process.env;
const baseUrl = env.FORGE_URL;
const owner = env.OWNER;
const repo = env.REPO;
const privateKey = readFileSync(env.PRIVATE_KEY_PATH, "utf8");
const out = { throttled: [], secondary: [], steps: [] };

const MyOctokit = Octokit.plugin(throttling, retry);
const throttle = {
  onRateLimit: (retryAfter, options, octokit, retryCount) => {
    out.throttled.push({ retryAfter, route: `${options.method} ${options.url}`, retryCount });
    return retryCount < 1;
  },
  onSecondaryRateLimit: (retryAfter, options, octokit, retryCount) => {
    out.secondary.push({ retryAfter, route: `${options.method} ${options.url}`, retryCount });
    return retryCount < 1;
  },
};
const log = { debug() {}, info() {}, warn() {}, error() {} };

async function fault(spec) {
  const r = await fetch(env.FAULTS_URL, { method: "POST", body: JSON.stringify(spec),
                                          headers: { "content-type": "application/json" } });
  if (!r.ok) throw new Error(`fault ${JSON.stringify(spec)}: ${r.status}`);
}

async function status(promise) {
  try {
    const r = await promise;
    return { status: r.status };
  } catch (e) {
    return { status: e.status, message: e.response?.data?.message ?? e.message,
             errors: e.response?.data?.errors ?? null };
  }
}

async function main() {
  // App authentication: the App's JWT, then the installation found and its token
  const appKit = new MyOctokit({ baseUrl, authStrategy: createAppAuth, auth: { appId: env.APP_ID,
                                 privateKey }, throttle, log });
  const app = (await appKit.rest.apps.getAuthenticated()).data;
  const installation = (await appKit.rest.apps.getRepoInstallation({ owner, repo })).data;
  out.app = { slug: app.slug, installation: installation.id };
  const octokit = new MyOctokit({ baseUrl, authStrategy: createAppAuth, log, throttle,
    auth: { appId: env.APP_ID, privateKey, installationId: installation.id },
    request: { retries: 2, retryAfter: 1 } });

  const label = (await octokit.rest.issues.createLabel({ owner, repo, name: "mail:new",
                                                         color: "0e8a16" })).data;
  out.label = { name: label.name, archived_at: label.archived_at };
  const made = [];
  for (let n = 0; n < 3; n++) {  // throttling spaces content creation 3 s apart, as shipped
    const body = n === 0 ? "cc @marco" : "hello";
    made.push((await octokit.rest.issues.create({ owner, repo, title: `Mail ${n}`, body,
                                                  labels: ["mail:new"] })).data);
  }
  out.made = made.map((i) => i.number);

  // pagination, over the Link header and over search (its items under `items`)
  out.listed = (await octokit.paginate(octokit.rest.issues.listForRepo,
    { owner, repo, state: "all", per_page: 2 })).map((i) => i.number);
  out.searched = (await octokit.paginate(octokit.rest.search.issuesAndPullRequests,
    { q: `repo:${owner}/${repo} is:issue label:mail:new`, per_page: 2 })).map((i) => i.number);
  out.mentioned = (await octokit.rest.issues.listForRepo({ owner, repo, mentioned: "marco" }))
    .data.map((i) => i.number);
  out.milestoneAny = (await octokit.rest.issues.listForRepo({ owner, repo, milestone: "*" }))
    .data.length;
  out.milestoneMissing = await status(octokit.rest.issues.listForRepo({ owner, repo,
                                                                        milestone: "3" }));

  // contents, raw: the file's text
  const raw = await octokit.rest.repos.getContent({ owner, repo: ".github",
    path: "vaultmail.yml", mediaType: { format: "raw" } });
  out.raw = { type: typeof raw.data, text: raw.data };

  const number = made[0].number;
  const comment = (await octokit.rest.issues.createComment({ owner, repo,
    issue_number: number, body: "first" })).data;
  await octokit.rest.issues.updateComment({ owner, repo, comment_id: comment.id, body: "edited" });
  out.comments = (await octokit.rest.issues.listComments({ owner, repo, issue_number: number }))
    .data.map((c) => c.body);
  await octokit.rest.issues.addLabels({ owner, repo, issue_number: number,
                                        labels: ["mail:working"] });
  out.left = (await octokit.rest.issues.removeLabel({ owner, repo, issue_number: number,
                                                      name: "mail:new" })).data.map((l) => l.name);
  out.closed = (await octokit.rest.issues.update({ owner, repo, issue_number: number,
    state: "closed", state_reason: "completed" })).data.state;

  // conditional requests: a 304 is thrown as a RequestError with status 304
  const got = await octokit.rest.issues.get({ owner, repo, issue_number: number });
  out.conditional = await status(octokit.rest.issues.get({ owner, repo, issue_number: number,
    headers: { "if-none-match": got.headers.etag } }));

  // errors
  out.missing = await status(octokit.rest.issues.get({ owner, repo, issue_number: 9999 }));
  out.duplicate = await status(octokit.rest.issues.createLabel({ owner, repo, name: "mail:new",
                                                                color: "ededed" }));

  // the plugins: a secondary limit (Retry-After 1) waited out by throttling, a 502 retried
  await fault({ route: "POST /repos/{owner}/{repo}/issues/{issue_number}/comments",
                kind: "secondary_limit", status: 403, count: 1, retry_after: 1 });
  out.afterSecondary = await status(octokit.rest.issues.createComment({ owner, repo,
    issue_number: number, body: "after a secondary limit" }));
  await fault({ route: "GET /repos/{owner}/{repo}/issues/{issue_number}", status: 502,
                count: 1 });
  out.afterServerError = await status(octokit.rest.issues.get({ owner, repo,
                                                               issue_number: made[1].number }));
}

main().then(
  () => { process.stdout.write(JSON.stringify(out)); },
  (e) => {
    out.error = { message: String(e?.message ?? e), status: e?.status ?? null,
                  url: e?.request?.url ?? null, data: e?.response?.data ?? null };
    process.stdout.write(JSON.stringify(out));
    process.exitCode = 1;
  },
);
