// Golden blocks written by hyperdb 3.5.0 itself (header, entries, a deletion, an InflatedEntry).
// Output: hyperdb-3.5.0.json. See package.json for how to rerun.
const hyperdb = require('hyperdb')
const ram = require('random-access-memory')
const messages = require('hyperdb/lib/messages')
const db = hyperdb(ram, { valueEncoding: 'binary' })
db.ready(() => {
  const ops = [['put', '/a', 'one'], ['put', '/b/c', 'two'], ['put', '/a', 'three'], ['del', '/b/c'], ['put', 'hello', Buffer.from([0, 255, 1])]]
  let i = 0
  const next = () => {
    if (i === ops.length) return dump()
    const [op, k, v] = ops[i++]
    if (op === 'put') db.put(k, Buffer.from(v), next)
    else db.del(k, next)
  }
  next()
})
function dump () {
  const feed = db.source
  const out = []
  const get = (j) => {
    if (j === feed.length) {
      const inflated = messages.InflatedEntry.encode({ key: 'x/y', value: Buffer.from('v'), deleted: false, trie: Buffer.alloc(0), clock: [1, 300], inflate: 0, feeds: [{ key: Buffer.alloc(32, 1) }], contentFeed: Buffer.alloc(32, 2) })
      console.log(JSON.stringify({ producer: 'hyperdb@3.5.0', feed_blocks: out, inflated_entry: inflated.toString('hex') }, null, 1))
      return
    }
    feed.get(j, { valueEncoding: 'binary' }, (err, b) => { if (err) throw err; out.push(b.toString('hex')); get(j + 1) })
  }
  get(0)
}
