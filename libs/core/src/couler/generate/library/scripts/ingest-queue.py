"""Consume messages from a queue or stream (Kafka, NATS, Amazon SQS) into a JSON-lines table."""
from _common import env_secret, fail, need, out_dir, parser

p = parser(__doc__, produces=("data",))
p.add_argument("--broker", default="kafka", help="kafka, nats or sqs")
p.add_argument("--topic", required=True, help="the Kafka topic, NATS subject or SQS queue URL")
p.add_argument("--url-env", default="QUEUE_URL",
               help="the environment variable holding the bootstrap servers or NATS URL "
                    "(not used by sqs: boto3 reads the AWS_* variables)")
p.add_argument("--group", default="couler", help="the consumer group (kafka)")
p.add_argument("--max-messages", default="1000", help="stop after this many messages")
p.add_argument("--timeout", default="10", help="stop after this many idle seconds")
args = p.parse_args()

import json

limit, timeout = int(args.max_messages), float(args.timeout)
messages = []


def decode(raw):
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"value": text}


if args.broker == "kafka":
    kafka = need("kafka", package="kafka-python")
    consumer = kafka.KafkaConsumer(
        args.topic, bootstrap_servers=env_secret(args.url_env, "--url-env").split(","),
        group_id=args.group, auto_offset_reset="earliest",
        consumer_timeout_ms=int(timeout * 1000))
    for record in consumer:
        messages.append(decode(record.value))
        if len(messages) >= limit:
            break
    consumer.close()
elif args.broker == "nats":
    import asyncio

    nats = need("nats", package="nats-py")

    async def consume():
        nc = await nats.connect(env_secret(args.url_env, "--url-env"))
        sub = await nc.subscribe(args.topic)
        try:
            while len(messages) < limit:
                msg = await sub.next_msg(timeout=timeout)
                messages.append(decode(msg.data))
        except nats.errors.TimeoutError:
            pass
        await nc.close()

    asyncio.run(consume())
elif args.broker == "sqs":
    boto3 = need("boto3")
    sqs = boto3.client("sqs")
    while len(messages) < limit:
        batch = sqs.receive_message(QueueUrl=args.topic, MaxNumberOfMessages=10,
                                    WaitTimeSeconds=min(20, int(timeout))).get("Messages", [])
        if not batch:
            break
        for m in batch:
            messages.append(decode(m["Body"]))
            sqs.delete_message(QueueUrl=args.topic, ReceiptHandle=m["ReceiptHandle"])
else:
    fail(f"--broker {args.broker!r}: expected kafka, nats or sqs")
path = out_dir(args.out_data) / "messages.jsonl"
with open(path, "w") as fh:
    for m in messages:
        fh.write(json.dumps(m if isinstance(m, dict) else {"value": m}) + "\n")
if not messages:
    fail(f"--topic {args.topic}: no message within {timeout:g} s (nothing to process)")
print(f"{len(messages)} message(s) from {args.broker} {args.topic} -> {path}")
