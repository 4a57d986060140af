// The viewer is served by the API under /ui (services/api/conductor_api/ui.py), from the
// package folder this build writes; `npm run dev` proxies the API to a local server
// (CONDUCTOR_API=http://host:port to point it elsewhere).
import { defineConfig, loadEnv } from 'vite';

export default defineConfig(({ mode }) => {
  const api = loadEnv(mode, '.', 'CONDUCTOR_').CONDUCTOR_API ?? 'http://127.0.0.1:8000';
  return {
    base: '/ui/',
    build: {
      // Relative to ui/: the Python package ships the built files (no Node at install time).
      outDir: '../services/api/conductor_api/ui/static',
      emptyOutDir: true, // the folder is outside ui/: Vite only empties it when told to
      assetsDir: 'assets',
      target: 'es2022',
      sourcemap: false,
      // No polyfill injected into the page: it runs under script-src 'self'.
      modulePreload: { polyfill: false },
      assetsInlineLimit: 0,
    },
    server: {
      host: '127.0.0.1',
      port: 5173,
      strictPort: true,
      proxy: { '/v1': { target: api } },
    },
  };
});
