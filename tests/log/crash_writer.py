"""Child process for test_crash: appends forever, printing each acknowledged seq range."""

import sys

from feedlog.log.feed import Feed, Write

path, batch = sys.argv[1], int(sys.argv[2])
feed = Feed.open(path)
n = feed.length
while True:
    out = feed.append([Write(f"k{n + i}", f"value {n + i}".encode() * 3) for i in range(batch)])
    n = out[-1].seq + 1
    # acknowledged: append() returned, so the batch is durable
    sys.stdout.write(f"{out[0].seq} {out[-1].seq}\n")
    sys.stdout.flush()
