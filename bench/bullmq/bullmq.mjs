// The BullMQ side of the bench's fire-and-forget workload, run by node.
//
//   node bullmq.mjs producer REDIS_URL QUEUE N PRODUCERS
//   node bullmq.mjs worker   REDIS_URL QUEUE N CONCURRENCY
//
// Each role connects, prints "ready", and waits for the line "go" on its
// standard input. The producer then adds N jobs from PRODUCERS concurrent
// loops, each awaiting its add (Queue.add, one job per call), and prints
// "sent"; the worker processes jobs with CONCURRENCY concurrent no-op
// processors and prints "done" when it has processed N. Both close when
// their standard input says "stop" or ends. Errors go to standard error
// and end the process with status 1.
import readline from "node:readline";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const [role, url, name, nArg, parArg] = process.argv.slice(2);
const n = Number(nArg);
const par = Number(parArg);
if (!["producer", "worker"].includes(role) || !url || !name || !(n > 0) || !(par > 0)) {
  console.error("usage: node bullmq.mjs producer|worker REDIS_URL QUEUE N PARALLELISM");
  process.exit(2);
}

const payload = "0123456789abcdef";
const input = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// next resolves to the next line of standard input, or "stop" at its end.
async function next() {
  const { value, done } = await input.next();
  return done ? "stop" : value.trim();
}

function fail(err) {
  console.error(err && err.stack ? err.stack : String(err));
  process.exit(1);
}

async function producer() {
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  // Completed jobs are removed, as Disker removes what its workers
  // acknowledge; BullMQ keeps them all by default.
  const queue = new Queue(name, { connection, defaultJobOptions: { removeOnComplete: true } });
  await queue.waitUntilReady();
  console.log("ready");
  if ((await next()) !== "go") return queue.close().then(() => connection.quit());
  let added = 0;
  const loop = async () => {
    while (added < n) {
      added++;
      await queue.add("noop", payload);
    }
  };
  await Promise.all(Array.from({ length: par }, loop));
  console.log("sent");
  while ((await next()) !== "stop");
  await queue.close();
  await connection.quit();
}

async function worker() {
  const connection = new IORedis(url, { maxRetriesPerRequest: null });
  let processed = 0;
  const w = new Worker(
    name,
    async () => {
      if (++processed === n) console.log("done");
    },
    { connection, concurrency: par },
  );
  w.on("error", fail);
  await w.waitUntilReady();
  console.log("ready");
  while ((await next()) !== "stop");
  await w.close();
  await connection.quit();
}

(role === "producer" ? producer() : worker()).then(() => process.exit(0), fail);
