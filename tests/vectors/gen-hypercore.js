// Golden vectors from hypercore itself (compat mode: the signature covers caps.treeSignableCompat).
// Output: hypercore-11.37.1.json. See package.json for how to rerun.
const Hypercore = require('hypercore')
const crypto = require('hypercore-crypto')
const caps = require('hypercore/lib/caps')
const os = require('os'), path = require('path'), fs = require('fs')
async function main () {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hc-'))
  const keyPair = crypto.keyPair(Buffer.alloc(32, 7))
  const core = new Hypercore(dir, { keyPair, compat: true })
  await core.ready()
  const blocks = []
  for (let i = 0; i < 13; i++) blocks.push(Buffer.from('block-' + i + '-' + 'x'.repeat(i * 7)))
  const states = []
  const batches = [[0], [1, 2], [3], [4, 5, 6, 7, 8], [9], [10, 11, 12]]
  for (const b of batches) {
    await core.append(b.map(i => blocks[i]))
    const th = await core.treeHash()
    states.push({ length: core.length, byte_length: core.byteLength, fork: core.fork,
      tree_hash: th.toString('hex'), signature: core.state.signature.toString('hex'),
      signable: caps.treeSignableCompat(th, core.length, core.fork).toString('hex') })
  }
  console.log(JSON.stringify({
    seed: Buffer.alloc(32, 7).toString('hex'),
    public_key: keyPair.publicKey.toString('hex'), feed_key: core.key.toString('hex'),
    discovery_key: core.discoveryKey.toString('hex'),
    blocks: blocks.map(b => b.toString('hex')),
    leaf_hashes: blocks.map(b => crypto.data(b).toString('hex')),
    states }, null, 1))
  await core.close()
}
main().catch(e => { console.error(e); process.exit(1) })
