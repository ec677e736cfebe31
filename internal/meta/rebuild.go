package meta

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// OpenRecords opens the metadata at path. A file that does not read as
// a database is set aside (path.corrupt-TIME) and a new one opened,
// which start-up then rebuilds from the disk (Rebuild).
func OpenRecords(path string, log *slog.Logger) (*DB, error) {
	db, err := Open(path)
	if err == nil {
		// Records that are JSON but not molt's records are corrupt too.
		if err = decodeRecords(db); err != nil {
			db.Close()
			err = fmt.Errorf("open %s: %w: %w", path, ErrCorrupt, err)
		}
	}
	if !errors.Is(err, ErrCorrupt) {
		return db, err
	}
	aside := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, errors.Join(err, fmt.Errorf("set the corrupt database aside: %w", rerr))
	}
	log.Error("metadata database is corrupt; set aside, rebuilding it from the pool", "err", err, "set_aside", aside)
	return Open(path)
}

// decodeRecords decodes every image, sandbox and checkpoint record.
func decodeRecords(db *DB) error {
	if _, err := List[Image](db, Images); err != nil {
		return err
	}
	if _, err := List[SandboxRecord](db, Sandboxes); err != nil {
		return err
	}
	_, err := List[CheckpointRecord](db, Checkpoints)
	return err
}

// Rebuild records, in a database that was empty when opened (Fresh),
// the images, checkpoints and sandboxes on disk, from their on-disk
// records; what cannot be explained goes to quarantine. All records
// commit in one transaction, with the end of the rebuild: a crash
// leaves it to the next start. The engine's reconcile then runs as on
// every start.
func (d *DB) Rebuild(p *Disk) error {
	type put struct {
		bucket, key string
		b           []byte
	}
	var puts []put
	var imgs, cks, sbs int

	for _, e := range p.List("images") {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		if p.ValidName("image", name) != nil {
			// Left where it is: an image is a read-only subvolume,
			// which cannot move to another directory.
			p.Log.Warn("not an image name; left in the pool unlisted", "path", filepath.Join(filepath.Dir(p.ImageCopy(name)), name))
			continue
		}
		var img Image
		if b, err := os.ReadFile(p.ImageCopy(name)); err != nil || json.Unmarshal(b, &img) != nil || img.Name != name {
			img = Image{Name: name, Source: "unknown (rebuilt from the pool)"}
			if fi, err := e.Info(); err == nil {
				img.Created = fi.ModTime().UTC()
			}
		}
		b, _ := json.Marshal(img)
		puts = append(puts, put{Images, name, b})
		imgs++
	}

	known := map[string]CheckpointRecord{}
	for _, e := range p.List("checkpoints") {
		id := e.Name()
		ck, why := p.Checkpoint(id)
		if why != "" {
			if err := p.Quarantine(filepath.Dir(p.ManifestCopy(id)), "checkpoint-"+id, why); err != nil {
				return err
			}
			continue
		}
		known[id] = ck
	}
	for _, ck := range known {
		// A parent the pool no longer holds (its deletion's rewrite of
		// this manifest was lost) leaves the checkpoint a root.
		if _, ok := known[ck.Parent]; ck.Parent != "" && !ok {
			p.Log.Warn("rebuilt checkpoint names a parent the pool does not hold; it becomes a root", "checkpoint", ck.ID, "parent", ck.Parent)
			ck.Parent = ""
		}
		b, _ := json.Marshal(ck)
		puts = append(puts, put{Checkpoints, ck.ID, b})
		cks++
	}

	names := map[string]string{}
	ents := p.List("sandboxes")
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		id := e.Name()
		rec, why := sandboxOnDisk(p, id)
		if why == "" && rec.Name != "" && names[rec.Name] != "" {
			p.Log.Warn("rebuilt sandbox has the name of another; it loses it", "sandbox", id, "name", rec.Name, "other", names[rec.Name])
			rec.Name = ""
		}
		if why != "" {
			if err := p.Quarantine(filepath.Dir(p.SandboxCopy(id)), "sandbox-"+id, why); err != nil {
				return err
			}
			continue
		}
		if rec.Name != "" {
			names[rec.Name] = id
		}
		b, _ := json.Marshal(rec)
		puts = append(puts, put{Sandboxes, id, b})
		sbs++
	}
	err := d.Update(func(tx *Tx) error {
		for _, p := range puts {
			if err := tx.PutRaw(p.bucket, p.key, p.b); err != nil {
				return err
			}
		}
		return tx.Rebuilt()
	})
	if err != nil {
		return fmt.Errorf("rebuild the metadata: %w", err)
	}
	if imgs+cks+sbs > 0 {
		p.Log.Warn("metadata rebuilt from the pool", "images", imgs, "checkpoints", cks, "sandboxes", sbs)
	}
	return nil
}

// sandboxOnDisk reads the record of sandbox id from its copy
// (sandbox.json), or says why it cannot.
func sandboxOnDisk(p *Disk, id string) (SandboxRecord, string) {
	var rec SandboxRecord
	file := p.SandboxCopy(id)
	name := filepath.Base(file)
	b, err := os.ReadFile(file)
	if err != nil {
		return rec, "no readable " + name + ": " + err.Error()
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, name + " does not decode: " + err.Error()
	}
	if rec.ID != id {
		return rec, fmt.Sprintf("%s names sandbox %q", name, rec.ID)
	}
	if rec.Name != "" && p.ValidName("sandbox", rec.Name) != nil {
		return rec, fmt.Sprintf("name %q", rec.Name)
	}
	if _, err := os.Lstat(p.SandboxRoot(id)); err != nil {
		return rec, "no root"
	}
	return rec, ""
}
