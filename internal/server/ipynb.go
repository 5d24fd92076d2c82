package server

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
)

// The Jupyter notebook format (nbformat 4), as the notebook's export and
// import speak it: https://nbformat.readthedocs.io/en/latest/format_description.html

// jsonMIME matches the MIME types whose data nbformat keeps as JSON, not text.
var jsonMIME = regexp.MustCompile(`^application/(.*\+)?json$`)

// toIpynb renders nb as an nbformat 4.5 document.
func toIpynb(nb Notebook) ([]byte, error) {
	cells := make([]map[string]any, 0, len(nb.Cells))
	for _, c := range nb.Cells {
		cell := map[string]any{"id": c.ID, "cell_type": c.Type, "metadata": map[string]any{}, "source": c.Source}
		if c.Type == "" {
			cell["cell_type"] = "code"
		}
		if cell["cell_type"] == "code" {
			cell["execution_count"] = c.ExecutionCount
			outs := make([]map[string]any, 0, len(c.Outputs))
			for _, o := range c.Outputs {
				outs = append(outs, ipynbOutput(o, c.ExecutionCount))
			}
			cell["outputs"] = outs
		}
		cells = append(cells, cell)
	}
	doc := map[string]any{
		"nbformat": 4, "nbformat_minor": 5,
		"metadata": map[string]any{
			"kernelspec":    map[string]any{"name": "python3", "display_name": "Python 3", "language": "python"},
			"language_info": map[string]any{"name": "python"},
		},
		"cells": cells,
	}
	return json.MarshalIndent(doc, "", " ")
}

func ipynbOutput(o CellOutput, count *int) map[string]any {
	switch o.Type {
	case "stdout", "stderr":
		return map[string]any{"output_type": "stream", "name": o.Type, "text": o.Text}
	case "error":
		tb := []string{}
		if o.Traceback != "" {
			tb = strings.Split(o.Traceback, "\n")
		}
		return map[string]any{"output_type": "error", "ename": o.Name, "evalue": o.Value, "traceback": tb}
	}
	data := map[string]any{}
	for mt, v := range o.Data {
		if jsonMIME.MatchString(mt) && json.Valid([]byte(v)) {
			data[mt] = json.RawMessage(v)
		} else {
			data[mt] = v
		}
	}
	if o.IsMainResult {
		return map[string]any{"output_type": "execute_result", "execution_count": count, "data": data, "metadata": map[string]any{}}
	}
	return map[string]any{"output_type": "display_data", "data": data, "metadata": map[string]any{}}
}

// multiline is nbformat's text: a string, or a list of strings to join.
type multiline string

func (m *multiline) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*m = multiline(s)
		return nil
	}
	var parts []string
	if err := json.Unmarshal(b, &parts); err != nil {
		return err
	}
	*m = multiline(strings.Join(parts, ""))
	return nil
}

type ipynbDoc struct {
	NBFormat *int        `json:"nbformat"`
	Cells    []ipynbCell `json:"cells"`
}

type ipynbCell struct {
	ID             string            `json:"id"`
	CellType       string            `json:"cell_type"`
	Source         multiline         `json:"source"`
	ExecutionCount *int              `json:"execution_count"`
	Outputs        []ipynbCellOutput `json:"outputs"`
}

type ipynbCellOutput struct {
	OutputType string                     `json:"output_type"`
	Name       string                     `json:"name"`
	Text       multiline                  `json:"text"`
	Data       map[string]json.RawMessage `json:"data"`
	EName      string                     `json:"ename"`
	EValue     string                     `json:"evalue"`
	Traceback  []string                   `json:"traceback"`
}

// fromIpynb reads the cells of an nbformat 4 document. Metadata and
// attachments are not kept.
func fromIpynb(b []byte) ([]NotebookCell, error) {
	var doc ipynbDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, badRequest("not a Jupyter notebook (.ipynb, nbformat 4): %v", err)
	}
	if doc.NBFormat == nil || *doc.NBFormat != 4 {
		return nil, badRequest("not a Jupyter notebook of nbformat 4 (the \"nbformat\" field): convert it with `jupyter nbconvert --to notebook`")
	}
	cells := make([]NotebookCell, 0, len(doc.Cells))
	for i, c := range doc.Cells {
		nc := NotebookCell{ID: c.ID, Type: c.CellType, Source: string(c.Source), Outputs: []CellOutput{}}
		if nc.ID != "" && !cellIDPattern.MatchString(nc.ID) {
			nc.ID = "" // nbformat before 4.5 had no ids; checkCells gives one
		}
		if c.CellType != "code" {
			cells = append(cells, nc)
			continue
		}
		nc.ExecutionCount = c.ExecutionCount
		for j, o := range c.Outputs {
			switch o.OutputType {
			case "stream":
				if o.Name != "stdout" && o.Name != "stderr" {
					return nil, badRequest("cells[%d].outputs[%d]: a stream named %q (stdout or stderr)", i, j, o.Name)
				}
				nc.Outputs = append(nc.Outputs, CellOutput{Type: o.Name, Text: string(o.Text)})
			case "error":
				nc.Outputs = append(nc.Outputs, CellOutput{Type: "error", Name: o.EName, Value: o.EValue, Traceback: strings.Join(o.Traceback, "\n")})
				nc.Status = "error"
			case "execute_result", "display_data":
				out := CellOutput{Type: "result", IsMainResult: o.OutputType == "execute_result", Data: map[string]string{}}
				for mt, raw := range o.Data {
					var text multiline
					if err := json.Unmarshal(raw, &text); err == nil && !jsonMIME.MatchString(mt) {
						out.Data[mt] = string(text)
					} else {
						var compact bytes.Buffer
						if json.Compact(&compact, raw) != nil {
							return nil, badRequest("cells[%d].outputs[%d].data[%q] is not JSON", i, j, mt)
						}
						out.Data[mt] = compact.String() // JSON data, kept as its text
					}
				}
				nc.Outputs = append(nc.Outputs, out)
			default:
				return nil, badRequest("cells[%d].outputs[%d]: output_type %q is not nbformat 4's (stream, display_data, execute_result, error)", i, j, o.OutputType)
			}
		}
		if nc.ExecutionCount != nil && nc.Status == "" {
			nc.Status = "ok"
		}
		cells = append(cells, nc)
	}
	return cells, nil
}
