package tools

import (
	"encoding/base64"
	"encoding/json"

	"github.com/sandloop/sandloop/internal/llm"
)

// ToLLM returns the set's tools as an LLM provider takes them: schemas
// generated from the input types, descriptions from the .md files.
func (s *Set) ToLLM() []llm.Tool {
	out := make([]llm.Tool, 0, len(s.tools))
	for _, t := range s.tools {
		b, err := json.Marshal(t.InputSchema)
		if err != nil {
			panic(err) // a schema from jsonschema.For always marshals
		}
		out = append(out, llm.Tool{Name: t.Name, Description: t.Description, Parameters: b})
	}
	return out
}

// LLMImages returns res's images as an LLM message carries them.
func (res *Result) LLMImages() []llm.Image {
	var out []llm.Image
	for _, img := range res.Images {
		out = append(out, llm.Image{MediaType: img.MIMEType, Data: base64.StdEncoding.EncodeToString(img.Data)})
	}
	return out
}
