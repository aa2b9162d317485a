// The one thread pool of the kernel library: every kernel that splits its work over threads
// (quantized and float products, attention of every kind, the tiled layout, AMX) runs it here
// through parallel_units, or brisk_parallel_for from sources that see only C. Workers wait
// briefly (yielding) for the next job, then sleep on a condition. One pool, not a new
// std::thread per call: a decode step makes ~200 kernel calls, and the skinny float product
// and packed-KV attention used to start and join their threads on each.
// Jobs run one at a time (a kernel must not call parallel_units from inside a job).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace brisk {

class Pool {
  static constexpr std::chrono::microseconds kSpin{50};
  // A job's state: its generation's low bits, whether the caller has closed it, and how many
  // workers joined before that. The caller runs units itself and, once none are left, closes
  // the job and waits only for the workers that joined: a worker the OS has not run yet (on two
  // cores it shares one with Python's thread) finds the job closed and skips it, where the
  // caller used to wait out its time slice for it to say it had nothing to do.
  static constexpr uint64_t kClosed = uint64_t(1) << 31, kJoined = kClosed - 1;

 public:
  void run(int threads, const std::function<void()>& job) {
    threads = std::max(1, threads);
    std::unique_lock<std::mutex> serial(run_lock_);  // one job at a time through the pool
    grow(threads - 1);
    job_ = &job;
    done_.store(0);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      wanted_ = threads - 1;
      const uint64_t generation = generation_.fetch_add(1) + 1;
      state_.store(generation << 32, std::memory_order_release);
    }
    wake_.notify_all();
    job();
    const uint64_t joined = state_.fetch_or(kClosed, std::memory_order_acq_rel) & kJoined;
    while (done_.load(std::memory_order_acquire) < joined) std::this_thread::yield();
    job_ = nullptr;
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      stop_ = true;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  void grow(int n) {
    while (int(workers_.size()) < n) {
      // The worker starts from the generation before this job's, however late it runs.
      const int index = int(workers_.size());
      const uint64_t seen = generation_.load();
      workers_.emplace_back([this, index, seen] { loop(index, seen); });
    }
  }

  // Joins job `generation` unless the caller has closed it (or a newer job has begun).
  bool join(uint64_t generation) {
    uint64_t s = state_.load(std::memory_order_acquire);
    while ((s >> 32) == (generation & 0xffffffffu) && !(s & kClosed))
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return true;
    return false;
  }

  void loop(int index, uint64_t seen) {
    for (;;) {
      // Wait a little for the next job (the next layer's call comes within microseconds), then
      // sleep. The wait yields rather than pauses: on two cores the Python thread and MLX's
      // stream thread need the core too, and a pausing worker held it (a 20,000-pause spin cost
      // SmolLM2 ~10% of its decode; the 50 us pause spin, against yielding, SmolLM2 1.13x and
      // Qwen-1.5B 1.12x, A/B).
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (int spin = 1; generation_.load(std::memory_order_acquire) == seen; ++spin) {
        std::this_thread::yield();
        if (spin % 4 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      {
        std::unique_lock<std::mutex> guard(mutex_);
        wake_.wait(guard, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (stop_) return;
        if (index >= wanted_) continue;
      }
      if (!join(seen)) continue;
      (*job_)();
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_lock_, mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> state_{0};
  std::atomic<uint64_t> done_{0};
  const std::function<void()>* job_ = nullptr;
  int wanted_ = 0;
  bool stop_ = false;
};

inline Pool& pool() {
  static Pool instance;
  return instance;
}

// Runs task(unit) for units [0, units) over the pool's threads.
inline void parallel_units(int units, int threads, const std::function<void(int)>& task) {
  if (units <= 0) return;
  threads = std::min(threads, units);
  if (threads <= 1) {
    for (int u = 0; u < units; ++u) task(u);
    return;
  }
  std::atomic<int> next{0};
  pool().run(threads, [&] {
    for (int u = next++; u < units; u = next++) task(u);
  });
}

}  // namespace brisk
