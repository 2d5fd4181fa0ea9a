package secretfile

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead_Cases(t *testing.T) {
	dir := t.TempDir()
	put := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	yml := put("s.yaml", "user: u\npassword: \"p w\"\n")
	js := put("s.json", `{"token": "t"}`)
	put("keys/user", "u\n")
	put("keys/password", "p\r\n")
	put("keys/.hidden", "skipped")
	keys := filepath.Join(dir, "keys")
	put("nested/sub/x", "x")
	bad := put("bad.yaml", "user: [secretvalue")
	empty := put("empty.yaml", "")
	t.Setenv(CredentialsVar, dir)

	for _, tt := range []struct {
		name, ref string
		want      map[string]string
		err       string
	}{
		{"yaml", yml, map[string]string{"user": "u", "password": "p w"}, ""},
		{"json", js, map[string]string{"token": "t"}, ""},
		{"directory", keys, map[string]string{"user": "u", "password": "p"}, ""},
		{"credential", "$CREDENTIALS_DIRECTORY/s.json", map[string]string{"token": "t"}, ""},
		{"missing", filepath.Join(dir, "nope"), nil, "nope: no such file or directory"},
		{"malformed", bad, nil, "bad.yaml: not a JSON or YAML map of strings"},
		{"empty", empty, nil, "empty.yaml: holds no secrets"},
		{"subdirectory", filepath.Join(dir, "nested"), nil, "sub is a directory"},
		{"relative", "s.yaml", nil, "not an absolute path"},
		{"other variable", "$HOME/s", nil, "only $CREDENTIALS_DIRECTORY/NAME may be expanded"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Read(tt.ref)
			if tt.err == "" {
				if err != nil || !maps.Equal(got, tt.want) {
					t.Fatalf("Read = %v, %v; want %v", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrUnreadable) || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Read = %v, want ErrUnreadable saying %q", err, tt.err)
			}
			if strings.Contains(err.Error(), "secretvalue") {
				t.Errorf("the error shows the file's content: %v", err)
			}
		})
	}
	t.Setenv(CredentialsVar, "")
	if _, err := Read("$CREDENTIALS_DIRECTORY/s.json"); err == nil || !strings.Contains(err.Error(), "$CREDENTIALS_DIRECTORY is not set") {
		t.Errorf("Read without the variable = %v", err)
	}
}
