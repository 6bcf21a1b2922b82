package file

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/caddy-idempotency/caddy-idempotency/store"
)

const journalName = "claims.log"

// journal keeps the claims for the process that opens the file next:
// every change to the claims in memory is appended to it first, with one
// write and no fsync. What write returns is in the kernel's page cache,
// which outlives the process (a SIGKILL, a panic, the OOM killer), so its
// claims hold their keys after a restart as they would have in memory: in
// progress until their lease passes, then a dead owner's (held.keep). Only
// a crash of the OS can lose what was not yet written back; an fsync per
// claim would double the cost of a new key.
//
// The journal is rewritten from the claims in memory when it opens and
// whenever it has grown to twice what that rewrite left (compact), so that
// it stays within a few times the claims in flight. Its methods are called
// under the claims' lock, which orders the entries as the changes in memory.
type journal struct {
	f     *os.File
	path  string
	size  int64         // bytes in f
	limit int64         // compact is due once size passes it
	due   chan struct{} // holds a signal while compact is due
	buf   []byte        // the entries of one append, reused
}

// compactMin is the least limit, so that a few claims in flight do not
// make every few appends rewrite the file.
const compactMin = 4 << 20

// An entry: a CRC-32C of the rest, so that a tail an OS crash tore ends
// the replay instead of corrupting it; the length of what follows the key;
// the key; the end of the lease (Unix nanoseconds) and how long past it
// the claim is kept for a dead owner (nanoseconds, held.keep); and the
// claim as the codec encodes it, none for a drop. Integers are big endian.
const (
	keyOff    = 4 + 4
	leaseOff  = keyOff + len(store.Key{})
	keepOff   = leaseOff + 8
	entryHead = keepOff + 8
	maxEntry  = 1 << 30 // no claim comes near; a length beyond is garbage
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// journalFormat seeds each entry's checksum, so that an entry of another
// format (the first kept no TTL) fails it, and ends the replay there,
// rather than be misread.
const journalFormat = 2

func checksum(b []byte) uint32 { return crc32.Update(journalFormat, castagnoli, b) }

// appendEntry appends the entry that puts e as k's claim, or drops k's
// claim if e is nil.
func appendEntry(dst []byte, k store.Key, e *held) []byte {
	var (
		expires int64
		keep    time.Duration
		blob    store.Encoded
	)
	if e != nil {
		expires, keep, blob = e.expires, e.keep, e.blob
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(entryHead-leaseOff+len(blob)))
	dst = append(dst, k[:]...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(expires))
	dst = binary.BigEndian.AppendUint64(dst, uint64(keep))
	dst = append(dst, blob...)
	binary.BigEndian.PutUint32(dst[start:], checksum(dst[start+4:]))
	return dst
}

// replay applies the entries of b in order, up to the first that is torn
// or not one, and returns the claims and the length of what it applied.
func replay(b []byte) (map[store.Key]*held, int) {
	claims := make(map[store.Key]*held)
	off := 0
	for len(b)-off >= entryHead {
		e := b[off:]
		n := int(binary.BigEndian.Uint32(e[4:])) // what follows the key
		end := leaseOff + n
		if n < entryHead-leaseOff || n > maxEntry || end > len(e) || checksum(e[4:end]) != binary.BigEndian.Uint32(e) {
			break
		}
		k := store.Key(e[keyOff:leaseOff])
		blob := store.Encoded(e[entryHead:end])
		switch {
		case len(blob) == 0:
			delete(claims, k)
		case blob.State() == store.InProgress:
			claims[k] = &held{
				blob:    bytes.Clone(blob),
				expires: int64(binary.BigEndian.Uint64(e[leaseOff:])),
				keep:    time.Duration(binary.BigEndian.Uint64(e[keepOff:])),
			}
		default:
			return claims, off
		}
		off += end
	}
	return claims, off
}

// loadClaims reads the claims that the journal at path kept from the
// process that had the file open before, less those whose completion it
// committed but died before it dropped the claim: the record wins. It
// compacts the journal and reports the bytes of its torn tail.
func loadClaims(db *bolt.DB, path string) (*claims, int, error) {
	// A compaction cut short by a crash left a partial copy; the journal
	// itself is whole.
	if err := os.Remove(path + ".tmp"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, 0, err
	}
	byKey, n := replay(data)
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(records)
		for k, e := range byKey {
			rec, err := store.DecodeRecord(b.Get(k[:]))
			if err == nil && rec.State == store.Completed && e.blob.ClaimedBy(rec.Token) {
				delete(byKey, k)
			}
		}
		return nil
	})
	j := &journal{path: path, due: make(chan struct{}, 1)}
	if err == nil {
		err = j.compact(byKey)
	}
	if err != nil {
		return nil, 0, err
	}
	return &claims{byKey: byKey, log: j}, len(data) - n, nil
}

// put appends e as k's claim.
func (j *journal) put(k store.Key, e *held) error {
	if j == nil {
		return nil
	}
	j.buf = appendEntry(j.buf[:0], k, e)
	return j.write()
}

// drop appends the end of the claims of keys.
func (j *journal) drop(keys ...store.Key) error {
	if j == nil || len(keys) == 0 {
		return nil
	}
	j.buf = j.buf[:0]
	for _, k := range keys {
		j.buf = appendEntry(j.buf, k, nil)
	}
	return j.write()
}

// write appends buf in one write, so that a killed process leaves whole
// entries. A failed write may leave part of one: it is cut off, or else
// the next compaction rewrites the file.
func (j *journal) write() error {
	n, err := j.f.Write(j.buf)
	if cap(j.buf) > 64<<10 {
		j.buf = nil // a sweep's drops; appends are small
	}
	if err != nil {
		if n > 0 && j.f.Truncate(j.size) != nil {
			j.limit = 0
			j.signal()
		}
		return fmt.Errorf("appending to %s: %w", j.path, err)
	}
	j.size += int64(n)
	if j.size > j.limit {
		j.signal()
	}
	return nil
}

func (j *journal) signal() {
	select {
	case j.due <- struct{}{}:
	default:
	}
}

// compact replaces the file with one put per claim of byKey. It writes a
// copy and renames it over the journal, so that a crash midway leaves the
// old one. Unsynced, like the appends: a crash of the OS may lose claims.
func (j *journal) compact(byKey map[store.Key]*held) error {
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	var size int64
	var entry []byte
	for k, e := range byKey {
		entry = appendEntry(entry[:0], k, e)
		w.Write(entry)
		size += int64(len(entry))
	}
	if err = w.Flush(); err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		// Not due again before the journal has grown as much once more.
		j.limit = j.size + max(compactMin, size)
		return err
	}
	if j.f != nil {
		j.f.Close()
	}
	j.f, j.size, j.limit = f, size, max(compactMin, 2*size)
	return nil
}

// close closes the file; later appends fail.
func (j *journal) close() error {
	if j == nil || j.f == nil {
		return nil
	}
	return j.f.Close()
}
