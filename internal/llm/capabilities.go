package llm

import "strings"

// SupportsImages guesses from its name whether a model accepts images. Hosted models
// are known; for local servers only well-known vision families are recognized, and an
// unknown model is assumed text-only, since sending an image to a text-only model is
// an error while not sending one only loses a plot. Options.Images overrides the guess.
func SupportsImages(provider, model string) bool {
	m := strings.ToLower(model)
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:] // "openai/gpt-4o" on a router
	}
	switch provider {
	case "anthropic":
		// Every Claude model since Claude 3 reads images; older ones are retired.
		return true
	case "openai":
		for _, p := range []string{"gpt-4o", "gpt-4.1", "gpt-4-turbo", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o"} {
			if strings.HasPrefix(m, p) {
				return !strings.HasPrefix(m, "o1-mini") && !strings.HasPrefix(m, "o3-mini")
			}
		}
		return false
	}
	// Ollama, vLLM, llama.cpp, LM Studio, routers: vision families by name.
	if SupportsImages("openai", m) || strings.HasPrefix(m, "claude-") {
		return true
	}
	for _, p := range []string{"llava", "bakllava", "llama3.2-vision", "llama4", "qwen2.5vl", "qwen2-vl", "qwen2.5-vl", "qwen3-vl",
		"gemma3", "minicpm-v", "moondream", "granite3.2-vision", "mistral-small3.1", "mistral-small3.2", "pixtral", "internvl"} {
		if strings.HasPrefix(m, p) {
			return true
		}
	}
	return strings.Contains(m, "vision") || strings.Contains(m, "-vl")
}
