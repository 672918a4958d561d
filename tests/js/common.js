// Shared by the kafkajs scripts that tests/test_kafkajs.py runs: a Kafka client for the
// bootstrap list on the command line, with kafkajs' log captured, and the one JSON line each
// script prints on stdout.
//
// Every kafkajs log entry is written to stderr (pytest shows it with a failing test). Entries
// at WARN or ERROR are also returned in the JSON as `problems`: against a healthy broker
// kafkajs has nothing to warn about, so the tests fail on any of them (an error kafkajs logs
// and then retries past would otherwise hide a broker gap).
'use strict';

// kafkajs 2.x prints a one-time notice that its default partitioner changed in 2.0 (to the
// Java client's murmur2 one, the partitioner used here); it says nothing about the broker.
process.env.KAFKAJS_NO_PARTITIONER_WARNING = '1';

const { Kafka, logLevel } = require('kafkajs');

const problems = [];

function logCreator() {
  return ({ namespace, level, label, log }) => {
    const { message, ...extra } = log;
    const line = `${label} [${namespace}] ${message} ${JSON.stringify(extra)}`;
    process.stderr.write(line + '\n');
    if (level === logLevel.ERROR || level === logLevel.WARN) problems.push(line);
  };
}

// KILN_TEST_TLS='{"ca": FILE, "cert": FILE, "key": FILE}' makes the client connect over TLS
// with that CA and client certificate (tests/test_tls.py).
function tlsOptions() {
  const spec = process.env.KILN_TEST_TLS;
  if (!spec) return undefined;
  const fs = require('fs');
  const { ca, cert, key } = JSON.parse(spec);
  const options = { ca: [fs.readFileSync(ca, 'utf8')] };
  // Without a client certificate: TLS for SASL_SSL (tests/test_sasl.py).
  if (cert) Object.assign(options, { cert: fs.readFileSync(cert, 'utf8'), key: fs.readFileSync(key, 'utf8') });
  return options;
}

// KILN_TEST_SASL='{"mechanism": "scram-sha-512", "username": U, "password": P}' makes the
// client authenticate with SASL (tests/test_sasl.py).
function saslOptions() {
  const spec = process.env.KILN_TEST_SASL;
  return spec ? JSON.parse(spec) : undefined;
}

function client(bootstrap, clientId) {
  const ssl = tlsOptions();
  const sasl = saslOptions();
  return new Kafka({
    clientId,
    brokers: bootstrap.split(','),
    logLevel: logLevel.INFO,
    logCreator,
    ...(ssl ? { ssl } : {}),
    ...(sasl ? { sasl } : {}),
  });
}

// Prints `result` plus the captured problems as one JSON line and exits 0; a thrown error
// prints {"error": ...} and exits 1.
function main(fn) {
  const deadline = setTimeout(() => {
    process.stdout.write(JSON.stringify({ error: 'script timed out after 60 s', problems }) + '\n');
    process.exit(2);
  }, 60000);
  fn()
    .then((result) => {
      clearTimeout(deadline);
      process.stdout.write(JSON.stringify({ ...result, problems }) + '\n');
      process.exit(0);
    })
    .catch((e) => {
      clearTimeout(deadline);
      process.stdout.write(JSON.stringify({ error: `${e.name}: ${e.message}`, stack: e.stack, problems }) + '\n');
      process.exit(1);
    });
}

module.exports = { client, main, problems };
