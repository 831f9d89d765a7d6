//! Whether a failed request failed for memory: the GPU's (CUDA or HIP out of memory) or the KV
//! cache's (exhausted while the request ran), from the error the server sent. Each server says
//! it in its own words; what is matched (lower case, anywhere in the server's error type, code
//! or message):
//!
//! - PyTorch, under vLLM, SGLang and TGI: `torch.OutOfMemoryError`, whose message starts
//!   `CUDA out of memory. Tried to allocate …` (`HIP out of memory` on ROCm); TGI passes it on
//!   as `Request failed during generation: Server error: CUDA out of memory …`.
//! - ggml under llama.cpp: `cudaMalloc failed: out of memory`; its server's KV cache exhausted
//!   by the slots together: `failed to find free space in the KV cache`, `failed to find a
//!   memory slot`, then `Context size has been exceeded.` (tools/server/server.cpp). One prompt
//!   longer than its slot is `exceed_context_size_error`: the request's size, not memory.
//! - SGLang's scheduler: `KV cache pool is full` (it retracts requests; one it cannot
//!   re-admit fails with it).
//!
//! Pure: strings in, a verdict out.

/// The phrases that mean the server ran out of memory for the request ([module docs](self)).
const PHRASES: [&str; 6] = [
    "out of memory",
    "outofmemory",
    "kv cache pool is full",
    "failed to find free space in the kv cache",
    "failed to find a memory slot",
    "context size has been exceeded",
];

/// Whether a request that failed with these server figures (each `None` where not said) ran
/// out of memory.
pub fn out_of_memory(server_type: Option<&str>, code: Option<&str>, message: Option<&str>) -> bool {
    [server_type, code, message]
        .into_iter()
        .flatten()
        .any(|text| {
            let lower = text.to_ascii_lowercase();
            PHRASES.iter().any(|p| lower.contains(p))
        })
}

#[cfg(test)]
mod tests {
    use super::out_of_memory;

    /// Each server's words for memory, and the look-alikes that are not memory.
    #[test]
    fn each_servers_memory_errors_and_not_their_look_alikes() {
        for (t, m) in [
            (
                Some("InternalServerError"),
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.10 GiB total capacity)",
            ),
            (
                Some("generation"),
                "Request failed during generation: Server error: CUDA out of memory.",
            ),
            (Some("OutOfMemoryError"), "allocation failed"),
            (Some("server_error"), "Context size has been exceeded."),
            (None, "KV cache pool is full. Retract requests."),
            (
                None,
                "ggml_backend_cuda_buffer_type_alloc_buffer: cudaMalloc failed: out of memory",
            ),
        ] {
            assert!(out_of_memory(t, None, Some(m)), "{t:?} {m}");
        }
        for (t, m) in [
            (
                Some("exceed_context_size_error"),
                "request (3001 tokens) exceeds the available context size (1024 tokens)",
            ),
            (Some("BadRequestError"), "max_tokens must be at least 1"),
            (Some("timeout"), ""),
        ] {
            assert!(!out_of_memory(t, None, Some(m)), "{t:?} {m}");
        }
        assert!(!out_of_memory(None, None, None));
    }
}
